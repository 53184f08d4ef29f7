"""Relays whose groups changed since the run last asked them which clients they hold.

A relay announces its live members' node-resident clients at the run check
(compute_node/relay_clients.py). Its pings list its members with their state, so the
coordinator sees a member die, come back or join without asking; a relay whose live
members differ from those it had when it was checked is asked again, and the clients it
holds follow (a dead member's clients are not the relay's until the member is back).
"""

from __future__ import annotations

from thrift_trainer.engine.nodes.pool import NodeHandle

Group = frozenset[str]


class RelayGroups:
    """The live members each relay of a run had when it was last checked."""

    def __init__(self) -> None:
        self._checked: dict[str, Group] = {}

    def checked(self, nodes: list[NodeHandle]) -> None:
        """``nodes`` were just asked: remember the groups of the relays among them."""
        for node in nodes:
            if node.members:
                self._checked[node.name] = live_members(node)

    def changed(self, nodes: list[NodeHandle]) -> list[NodeHandle]:
        """The alive relays among ``nodes`` whose live members changed since checked."""
        return [node for node in nodes if node.members and node.clients_checked
                and node.liveness.state() == "alive"
                and self._checked.get(node.name) != live_members(node)]


def live_members(node: NodeHandle) -> Group:
    """The relay's members that its last ping called alive."""
    return frozenset(member.node for member in node.members if member.state == "alive")
