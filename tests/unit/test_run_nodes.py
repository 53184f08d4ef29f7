"""The nodes of a run: one handle per node, whichever of its machine's names lists it."""

from __future__ import annotations

from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.membership import Member
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
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
    """Push nodes registered with the coordinator, which come and go."""

    def __init__(self) -> None:
        self.current: list[Member] = []

    def members(self) -> list[Member]:
        return list(self.current)

    def push_addresses(self) -> list[NodeAddress]:
        return [m.address for m in self.current]


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
