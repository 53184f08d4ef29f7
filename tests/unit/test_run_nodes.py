"""The nodes of a run: one handle per node, whichever of its machine's names lists it."""

from __future__ import annotations

import logging

from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.membership import Mailbox, Member
from thrift_trainer.engine.nodes.nodes_file import NodeAddress, NodesFileError
from thrift_trainer.engine.nodes.pull_client import PullNodeHandle
from thrift_trainer.engine.nodes.run_nodes import RunNodes


class FakeMembership:
    """Registrations: push nodes announcing these addresses, no pull nodes."""

    def __init__(self, addresses: list[NodeAddress]) -> None:
        self.addresses = addresses

    def members(self) -> list:
        return []

    def push_addresses(self) -> list[NodeAddress]:
        return list(self.addresses)


def _run_nodes(file_nodes: list[NodeAddress], registered: list[NodeAddress]) -> RunNodes:
    return RunNodes("r1", file_nodes, rpc_timeout=1.0, connect_timeout=1.0,
                    suspect_seconds=1.0, dead_seconds=2.0, nodes_source=lambda: file_nodes,
                    membership=FakeMembership(registered))


def test_a_registration_under_another_name_of_a_listed_node_adds_no_share():
    nodes = _run_nodes([NodeAddress("localhost", 9091)],
                       [NodeAddress("127.0.0.1", 9091), NodeAddress("LOCALHOST", 9091)])
    try:
        assert [n.name for n in nodes.nodes] == ["localhost:9091"]
        assert nodes.refresh() is False
        assert len(nodes.nodes) == 1
    finally:
        nodes.close()


def test_different_ports_and_hosts_are_different_nodes():
    nodes = _run_nodes([NodeAddress("localhost", 9091), NodeAddress("host-b", 9091)],
                       [NodeAddress("127.0.0.1", 9092)])
    try:
        assert [n.name for n in nodes.nodes] == ["localhost:9091", "host-b:9091",
                                                 "127.0.0.1:9092"]
    finally:
        nodes.close()


class Registrations:
    """Nodes registered with the coordinator, which come and go."""

    def __init__(self) -> None:
        self.current: list[Member] = []

    def members(self) -> list[Member]:
        return list(self.current)

    def push_addresses(self) -> list[NodeAddress]:
        return [m.address for m in self.current if m.address is not None]


def _member(port: int) -> Member:
    return Member(name=f"127.0.0.1:{port}", node_id=f"id-{port}", pull=False,
                  address=NodeAddress("127.0.0.1", port), liveness=Liveness(1.0, 2.0),
                  mailbox=None)


def test_a_node_that_left_and_came_back_shows_all_its_units_in_one_summary():
    registrations = Registrations()
    registrations.current = [_member(9091), _member(9092)]
    nodes = RunNodes("r1", [], rpc_timeout=1.0, connect_timeout=1.0, suspect_seconds=1.0,
                     dead_seconds=2.0, membership=registrations)
    try:
        first = nodes.nodes[0]
        first.stats.accepted, first.stats.samples = 3, 300
        registrations.current = [_member(9092)]  # 9091 left ...
        assert nodes.refresh() is True
        assert [n.name for n in nodes.nodes] == ["127.0.0.1:9092"]
        left = {s.node: s for s in nodes.summaries()}
        assert left["127.0.0.1:9091"].accepted == 3  # ... and what it did still counts
        registrations.current = [_member(9092), _member(9091)]  # ... and came back
        assert nodes.refresh() is True
        again = nodes.nodes[-1]
        assert again is not first and again.name == "127.0.0.1:9091"
        again.stats.accepted, again.stats.samples = 2, 200
        summaries = nodes.summaries()
        assert sorted(s.node for s in summaries) == ["127.0.0.1:9091", "127.0.0.1:9092"]
        back = next(s for s in summaries if s.node == "127.0.0.1:9091")
        assert (back.accepted, back.samples) == (5, 500)
    finally:
        nodes.close()


def _pull_member(node_id: str) -> Member:
    return Member(name=f"pull:{node_id}", node_id=node_id, pull=True, address=None,
                  liveness=Liveness(1.0, 2.0), mailbox=Mailbox())


def test_a_pull_node_that_registered_again_replaces_its_old_handle():
    """A restarted pull node registers under the name it had: the refresh says the nodes
    changed, so that the engine takes the new handle instead of the old one, whose mailbox
    is closed (every unit sent there would end unreached, and the node would get none)."""
    registrations = Registrations()
    first = _pull_member("laptop")
    registrations.current = [_member(9091), first]
    nodes = RunNodes("r1", [], rpc_timeout=1.0, connect_timeout=1.0, suspect_seconds=1.0,
                     dead_seconds=2.0, membership=registrations)
    try:
        old = next(n for n in nodes.nodes if n.name == "pull:laptop")
        assert isinstance(old, PullNodeHandle) and old.member is first
        assert nodes.refresh() is False  # nothing happened
        again = _pull_member("laptop")
        registrations.current = [_member(9091), again]  # the same name, a new registration
        assert nodes.refresh() is True
        assert sorted(n.name for n in nodes.nodes) == ["127.0.0.1:9091", "pull:laptop"]
        new = next(n for n in nodes.nodes if n.name == "pull:laptop")
        assert new.member is again and old not in nodes.nodes
        assert nodes.refresh() is False
    finally:
        nodes.close()


def test_an_unusable_nodes_file_keeps_the_nodes_and_is_reported_once_per_error(caplog):
    """The file is looked at every half-second during a round: its error is said once."""
    listed = [NodeAddress("localhost", 9091)]
    errors = [NodesFileError("compute_nodes.txt line 2: 'x' is not host,port")] * 3 + [None]

    def source() -> list[NodeAddress]:
        error = errors.pop(0)
        if error is not None:
            raise error
        return listed + [NodeAddress("localhost", 9092)]

    nodes = RunNodes("r1", listed, rpc_timeout=1.0, connect_timeout=1.0, suspect_seconds=1.0,
                     dead_seconds=2.0, nodes_source=source)
    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.run"):
            assert [nodes.refresh() for _ in range(3)] == [False] * 3
        assert caplog.text.count("keeping the current nodes") == 1
        assert nodes.refresh() and [n.name for n in nodes.nodes] == [
            "localhost:9091", "localhost:9092"]
    finally:
        nodes.close()
