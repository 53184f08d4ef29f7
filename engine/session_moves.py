"""Node sessions seen from the coordinator: moving them between nodes, dropping them.

`NodeSessions` is what `Algorithm.after_round` gets (the `SessionMoves` protocol of
training/units.py). A move goes **node to node** when both ends accept
connections: the coordinator asks the source to `send_session` to the target's address
(as the nodes file lists it, so that address must be reachable from the source), and the
payload never passes through the coordinator. When either end cannot be dialled (a node
in pull mode, which only dials out), the coordinator **relays**: `export_session` from the
source, then `import_session` into the target, passing the tensors through undecoded.
A pull node takes no calls at all: its export and import travel inside its leases
(see wire.node_calls), so relaying reaches it all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from thrift_trainer.engine.nodes.client import NodeClient
from thrift_trainer.engine.nodes.errors import NodeError, NodeRefused
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.training.units import SessionMoved, SessionMoveError

log = logging.getLogger("coordinator.sessions")
T = TypeVar("T")


class NodeSessions:
    """Session moves over the run's node connections; see the module docstring."""

    def __init__(self, run_id: str, nodes: Iterable[NodeHandle], placement: Mapping[str, str],
                 cannot_dial: Callable[[NodeHandle], bool] = lambda node: False) -> None:
        """``cannot_dial(node)``: whether other nodes cannot open connections to it (a node
        in pull mode, behind NAT, ...); a move with such an end is relayed."""
        self.run_id = run_id
        self.placement = dict(placement)
        self._nodes = {node.name: node for node in nodes}
        self._cannot_dial = cannot_dial

    def move(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        """Node to node when both ends accept connections, else relayed."""
        if self._cannot_dial(self._node(source)) or self._cannot_dial(self._node(target)):
            return self.relay(source, session, target, target_session, swap_id)
        return self.send(source, session, target, target_session, swap_id)

    def send(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        """The source node sends its session straight to the target node."""
        address = self._node(target).address
        assert address is not None  # `move` relays when the target cannot be dialled
        moved = self._call(source, f"send {session} to {target}", lambda client: client
                           .send_session(self.run_id, session, address, target_session, swap_id))
        return SessionMoved(bytes=moved, relayed=False)

    def relay(self, source: str, session: str, target: str, target_session: str,
              swap_id: int) -> SessionMoved:
        """Export from the source, import into the target, through the coordinator."""
        state = self._call(source, f"export {session}",
                           lambda client: client.export_session(self.run_id, session))
        moved = self._call(target, f"import {target_session}", lambda client: client
                           .import_session(self.run_id, target_session, swap_id, state))
        return SessionMoved(bytes=moved, relayed=True)

    def _node(self, name: str) -> NodeHandle:
        try:
            return self._nodes[name]
        except KeyError:
            raise SessionMoveError(f"node {name} is not one of this run's nodes") from None

    def _call(self, name: str, what: str, call: Callable[[NodeClient], T]) -> T:
        node = self._node(name)
        try:
            return call(node.client)
        except NodeRefused as exc:
            raise SessionMoveError(f"{what}: {name} refused: {exc}") from None
        except NodeError as exc:
            raise SessionMoveError(f"{what}: {name} did not answer: {exc}") from None


def drop_sessions(run_id: str, nodes: Iterable[NodeHandle]) -> int:
    """Ask every node to forget the run's sessions (best effort, short timeouts); returns
    how many nodes answered. A node that does not answer evicts them in time anyway."""
    answered = 0
    for node in nodes:
        try:
            node.client.drop_sessions(run_id)
            answered += 1
        except NodeError as exc:
            log.debug("could not drop the sessions of run %s on %s: %s", run_id, node.name, exc)
    return answered
