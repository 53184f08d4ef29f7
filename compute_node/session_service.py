"""The session calls of the ComputeNode service: export, import, send node to node, drop.

A mixin of the node's handler, over its `SessionStore` (``self.sessions``). Imports are
staged under their swap id and only take effect for a unit that carries that swap id
(compute_node/sessions.py), so a move never changes a unit in flight. A node that cannot
reach the target of a `send_session` answers ``ok = false`` with the reason, and the
coordinator may relay the session instead.
"""

from __future__ import annotations

import logging

from thrift_trainer.compute_node.call_errors import CallError, PeerRefused, mapped_errors
from thrift_trainer.compute_node.sessions import SessionError, SessionStore
from thrift_trainer.compute_node.weight_cache import WeightCache
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.rpc import connect
from thrift_trainer.wire.tensor_codec import CodecError, dict_to_wire, wire_to_dict
from thrift_trainer.wire.version import check_protocol_version

log = logging.getLogger("compute_node.sessions")

SEND_CONNECT_SECONDS = 5.0
SEND_READ_SECONDS = 60.0


def payload_bytes(tensors: list[ttypes.Tensor]) -> int:
    return sum(len(t.data) for t in tensors)


class SessionService:
    """export_session / import_session / send_session / drop_sessions of ComputeNode.Iface."""

    sessions: SessionStore
    weights: WeightCache

    def export_session(self, request: ttypes.SessionRequest) -> ttypes.SessionState:
        check_protocol_version(request.protocol_version, "node")
        tensors = self._exported(request.run_id, request.session)
        return ttypes.SessionState(run_id=request.run_id, session=request.session,
                                   tensors=tensors, bytes=payload_bytes(tensors))

    def import_session(self, request: ttypes.ImportSessionRequest) -> ttypes.SessionAck:
        check_protocol_version(request.protocol_version, "node")
        try:
            # Copies: the received frame's memory is reused once this call returns.
            tensors = {k: v.copy() for k, v in wire_to_dict(request.tensors).items()}
        except CodecError as exc:
            raise ttypes.InvalidRequest(message=f"session tensors: {exc}") from exc
        self.sessions.stage(request.run_id, request.session, request.swap_id, tensors)
        size = payload_bytes(request.tensors)
        log.info("session %s of run %s staged for swap %d (%d bytes)", request.session,
                 request.run_id, request.swap_id, size)
        return ttypes.SessionAck(ok=True, bytes=size)

    def send_session(self, request: ttypes.SendSessionRequest) -> ttypes.SessionAck:
        check_protocol_version(request.protocol_version, "node")
        tensors = self._exported(request.run_id, request.session)
        where = f"{request.target_host}:{request.target_port}"
        forward = ttypes.ImportSessionRequest(
            protocol_version=PROTOCOL_VERSION, run_id=request.run_id,
            session=request.target_session, swap_id=request.swap_id, tensors=tensors)
        try:  # the process's token and TLS settings apply, as to every connection
            with (mapped_errors(),
                  connect(ComputeNode.Client, request.target_host, request.target_port,
                          connect_timeout=SEND_CONNECT_SECONDS,
                          read_timeout=SEND_READ_SECONDS) as target):
                ack = target.import_session(forward)
        except PeerRefused as exc:
            return ttypes.SessionAck(ok=False, bytes=0, message=f"{where} refused: {exc}")
        except CallError as exc:
            return ttypes.SessionAck(ok=False, bytes=0, message=f"cannot reach {where}: {exc}")
        log.info("session %s of run %s sent to %s as %s (%d bytes)", request.session,
                 request.run_id, where, request.target_session, ack.bytes)
        return ack

    def drop_sessions(self, request: ttypes.DropSessionsRequest) -> ttypes.SessionAck:
        check_protocol_version(request.protocol_version, "node")
        dropped = self.sessions.drop_run(request.run_id)
        versions = self.weights.drop_run(request.run_id)  # the run has ended: nothing refers
        if dropped:
            log.info("dropped %d sessions of run %s", dropped, request.run_id)
        if versions:
            log.info("dropped %d kept weight versions of run %s", versions, request.run_id)
        return ttypes.SessionAck(ok=True, bytes=0, message=f"dropped {dropped} sessions")

    def _exported(self, run_id: str, name: str) -> list[ttypes.Tensor]:
        try:
            return dict_to_wire(self.sessions.export(run_id, name))
        except SessionError as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc
