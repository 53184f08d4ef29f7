"""The nodes of a run: one handle per node, whichever of its machine's names lists it."""

from __future__ import annotations

from engine.nodes.nodes_file import NodeAddress
from engine.nodes.run_nodes import RunNodes


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
