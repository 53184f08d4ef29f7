"""The nodes of one run: the nodes file's, the registered ones, joining and leaving.

A run starts with the nodes of compute_nodes.txt and the nodes registered with the
coordinator; before every round, and every half-second during one (the round engine's
checks), it reads the file again and looks at the registrations, so nodes join without a
restart, and a node that registers mid-round takes that round's queued units. A
registered node that left (or a pull node that registered again after a restart) leaves
the run; nodes of the file stay, since the file still lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.local_host import canonical_host
from thrift_trainer.engine.nodes.membership import Member, Membership
from thrift_trainer.engine.nodes.nodes_file import NodeAddress, NodesFileError
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.pull_client import PullNodeHandle
from thrift_trainer.engine.nodes.thrift_client import pushed_node
from thrift_trainer.engine.records import NodeCounts, NodeSummary
from thrift_trainer.wire.stats import PayloadBytes

log = logging.getLogger("coordinator.run")

# The handle of a node the run dials at an address (index: its place in the run): over
# Thrift by default; a simulation's in-process nodes otherwise.
Dial = Callable[[int, NodeAddress], NodeHandle]


class RunNodes:
    """The node handles of one run; `refresh()` before each round and during one."""

    def __init__(self, run_id: str, addresses: list[NodeAddress], *, rpc_timeout: float,
                 connect_timeout: float, suspect_seconds: float, dead_seconds: float,
                 nodes_source: Callable[[], list[NodeAddress]] | None = None,
                 membership: Membership | None = None, dial: Dial | None = None) -> None:
        self.run_id = run_id
        self.nodes: list[NodeHandle] = []
        self.left_out: list[NodeHandle] = []  # nodes that cannot serve the run (kept out)
        self.payload = PayloadBytes()  # the run's training-call bytes, nodes that left included
        self._rpc_timeout = rpc_timeout
        self._suspect_seconds, self._dead_seconds = suspect_seconds, dead_seconds
        self._nodes_source = nodes_source
        self._file_error: str | None = None  # the nodes file's error, said once
        self._membership = membership
        self._dial = dial or (lambda index, address: pushed_node(
            index, address, rpc_timeout, connect_timeout))
        self._next_index = 0
        self._registered_push: set[str] = set()  # push nodes that came by registering
        # Handles of nodes that left the run (or registered again): what they did still
        # counts for the node, by name, as the run store counts it.
        self._departed: list[NodeHandle] = []
        self._add_addresses(addresses)
        self._add_members()

    def refresh(self) -> bool:
        """Take in nodes added to the file or registered, drop those that left; True if
        the set changed. A pull node that registered again has the name it had, and a
        new handle: the set changed (the engine must drop the old one, whose mailbox is
        closed, or the restarted node would never be sent a unit)."""
        handles = list(self.nodes)
        before = {n.name for n in handles}
        if self._nodes_source is not None:
            self._read_file(self._nodes_source)
        self._add_members()
        after = {n.name for n in self.nodes}
        if after - before:
            log.info("run %s: nodes joined: %s", self.run_id, ", ".join(sorted(after - before)))
        if before - after:
            log.info("run %s: nodes left: %s", self.run_id, ", ".join(sorted(before - after)))
        again = sorted(n.name for n in self.nodes if n.name in before and n not in handles)
        if again:
            log.info("run %s: nodes registered again: %s", self.run_id, ", ".join(again))
        return after != before or bool(again)

    def _read_file(self, source: Callable[[], list[NodeAddress]]) -> None:
        """Take in the nodes file's new nodes; an unusable file keeps the current ones,
        said once per error (the file is looked at every half-second during a round)."""
        try:
            self._add_addresses(source())
        except NodesFileError as exc:
            if str(exc) != self._file_error:
                log.warning("run %s: keeping the current nodes: %s", self.run_id, exc)
            self._file_error = str(exc)
        else:
            self._file_error = None

    def leave_out(self, node: NodeHandle) -> None:
        """Keep ``node`` (whose `left_out` says why) out of the run, also after refreshes."""
        if node in self.nodes:
            self.nodes.remove(node)
            self.left_out.append(node)

    def summaries(self) -> list[NodeSummary]:
        """One summary per node that served the run: a node that left and came back (a
        restarted pull node registers again and gets a new handle) shows all its units."""
        by_name = {n.name: n.summary() for n in self.nodes + self.left_out}
        for gone in self._departed:
            summary = gone.summary()
            if summary.node in by_name:
                _add_counts(by_name[summary.node], summary)
            else:
                by_name[summary.node] = summary
        return list(by_name.values())

    def close(self) -> None:
        for node in self.nodes + self.left_out + self._departed:
            node.close()

    def _index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    def _add_addresses(self, addresses: list[NodeAddress]) -> list[NodeHandle]:
        """Handles for addresses not yet in the run; an alias of a node already in it (a
        registration as 127.0.0.1 of a node the file lists as localhost) adds nothing."""
        known = {_identity(n.address) for n in self.nodes + self.left_out
                 if n.address is not None}
        new = {}
        for address in addresses:
            if _identity(address) not in known:
                new.setdefault(_identity(address), address)
        added = [self._dial(self._index(), address) for address in new.values()]
        for node in added:
            node.liveness = Liveness(self._suspect_seconds, self._dead_seconds)
            node.payload = self.payload
        self.nodes.extend(added)
        return added

    def _add_members(self) -> None:
        """Registered nodes: push ones like nodes-file lines, pull ones by their mailbox."""
        if self._membership is None:
            return
        current = {m.name: m for m in self._membership.members()}
        staying = [n for n in self.nodes if self._still_member(n, current)]
        self._departed.extend(n for n in self.nodes if n not in staying)
        self.nodes = staying
        known = {n.name for n in self.nodes + self.left_out}
        pulled = [PullNodeHandle(self._index(), m, self._rpc_timeout)
                  for m in current.values() if m.pull and m.name not in known]
        for node in pulled:
            node.payload = self.payload
        self.nodes.extend(pulled)
        pushed = self._add_addresses(self._membership.push_addresses())
        self._registered_push.update(n.name for n in pushed)

    def _still_member(self, node: NodeHandle, current: dict[str, Member]) -> bool:
        """False for a registered node that left (or a pull node that re-registered)."""
        if isinstance(node, PullNodeHandle):
            return current.get(node.name) is node.member
        if node.name in self._registered_push and node.name not in current:
            self._registered_push.discard(node.name)
            return False
        return True


def _add_counts(total: NodeCounts, more: NodeCounts) -> None:
    for name, value in more.count_fields().items():
        setattr(total, name, getattr(total, name) + value)


def _identity(address: NodeAddress) -> tuple[str, int]:
    """One key per node, whatever name of its machine an address uses."""
    return canonical_host(address.host), address.port
