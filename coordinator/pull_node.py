"""A pull node as the round engine sees it: a mailbox instead of a connection.

`train` puts the unit in the node's mailbox (coordinator.membership) and waits for the
node to lease it and submit the result; `session_call` does the same with a session call
carried as bytes (wire.node_calls). Aborts and cancels withdraw the unit, and the node
hears of a cancelled lease with its next heartbeat.
"""

from __future__ import annotations

import uuid
from typing import Any

from coordinator.membership import Member, Pending, UnitKey, key_of
from coordinator.node_pool import AttemptAborted, NodeHandle
from wire import node_calls
from wire.generated import ttypes

QUICK_CALL_SECONDS = 15.0  # a relayed control call (drop_sessions) waits this long


class PullNodeHandle(NodeHandle):
    """A pull node as the round engine sees it: `train` puts the unit in the node's
    mailbox and waits for the node to lease it and submit the result."""

    accepts_connections = False

    def __init__(self, index: int, member: Member, rpc_timeout: float) -> None:
        self._init_common(index, member.name)
        self.address = None
        self.member = member
        self.liveness = member.liveness
        self._rpc_timeout = rpc_timeout
        self._pending: dict[UnitKey, Pending] = {}

    def train(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        mailbox = self.member.mailbox
        assert mailbox is not None
        pending = mailbox.put(request)
        self.payload.add(len(node_calls.encode(request)), 0)
        key = key_of(pending)
        with self._lock:
            self._pending[key] = pending
        try:
            if not pending.done.wait(self._rpc_timeout):
                mailbox.withdraw(pending, f"no result within {self._rpc_timeout:g}s")
        finally:
            with self._lock:
                self._pending.pop(key, None)
        if pending.failure:
            raise AttemptAborted(pending.failure)
        if pending.error:
            raise ttypes.InvalidRequest(message=pending.error)
        assert pending.result is not None
        self.payload.add(0, len(node_calls.encode(pending.result)))
        return pending.result

    def session_call(self, method: str, request: Any, quick: bool = False) -> Any:
        """A session call carried through the mailbox (see wire.node_calls): the node
        leases it, runs it and submits the answer. Raises like a call over the wire."""
        mailbox = self.member.mailbox
        assert mailbox is not None
        call = ttypes.NodeCall(call_id=uuid.uuid4().hex, method=method,
                               request=node_calls.encode(request))
        pending = mailbox.put(call=call)
        timeout = QUICK_CALL_SECONDS if quick else self._rpc_timeout
        if not pending.done.wait(timeout):
            mailbox.withdraw(pending, f"{method}: no answer within {timeout:g}s")
        if pending.failure:
            raise AttemptAborted(pending.failure)
        if pending.error:
            raise ttypes.InvalidRequest(message=pending.error)
        return node_calls.decode_result(method, pending.result)

    def abort(self, key: UnitKey, reason: str) -> bool:
        with self._lock:
            pending = self._pending.get(key)
        if pending is None or self.member.mailbox is None:
            return False
        self.member.mailbox.withdraw(pending, reason)
        return True

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        with self._lock:
            keys = [k for k in self._pending if k[:2] == (run_id, unit_id)
                    and attempt in (None, k[2])]
        for key in keys:
            with self._lock:
                pending = self._pending.get(key)
            if (pending is not None and self.member.mailbox is not None
                    and not pending.done.is_set()):
                pending.result = ttypes.TrainResult(
                    accepted=False, outcome=ttypes.UnitOutcome.CANCELLED, update=[],
                    num_samples=0, loss=0.0, error=0.0, compute_seconds=0.0, delay_seconds=0.0,
                    message="cancelled by the coordinator", node_id=self.name)
                self.member.mailbox.withdraw(pending, None)

    def can_be_told(self) -> bool:
        """Its cancels go to its mailbox, which never blocks."""
        return True

    def heartbeat(self) -> None:
        """Pull nodes call in; nothing to send them."""

    def _forget_connections(self) -> None:
        """No connections of its own."""

    def close(self) -> None:
        """No connections of its own."""
