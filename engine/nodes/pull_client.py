"""Pull nodes: the NodeClient of a node that leases its units instead of taking calls.

`train` puts the unit in the node's mailbox (engine.nodes.membership) and waits for the
node to lease it and submit the result; session calls do the same, carried as bytes
(wire.node_calls). Aborts and cancels withdraw the unit, and the node hears of a
cancelled lease with its next heartbeat.
"""

from __future__ import annotations

from typing import Any

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.client import NodePing, RunQuery
from thrift_trainer.engine.nodes.errors import (
    AttemptAborted,
    NodeRefused,
    NodeUnavailable,
    NodeUnfit,
)
from thrift_trainer.engine.nodes.membership import Member, Pending, UnitKey, key_of
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.thrift_client import SessionRequests, task_result, work_request
from thrift_trainer.engine.tasks import Task, TaskResult
from thrift_trainer.training.clients.settings import client_index_of
from thrift_trainer.wire import node_calls
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.stats import PayloadBytes, encoded_size

QUICK_CALL_SECONDS = 15.0  # a relayed control call (drop_sessions) waits this long


class PullNodeClient(SessionRequests):
    """A pull node's mailbox, called like a node."""

    accepts_connections = False
    address = None

    def __init__(self, member: Member, rpc_timeout: float) -> None:
        self.member = member
        self.payload = PayloadBytes()  # encoded requests and results: they travel in leases
        self._rpc_timeout = rpc_timeout
        self._lock = runtime.Lock()
        self._pending: dict[UnitKey, Pending] = {}

    def train(self, task: Task) -> TaskResult:
        mailbox = self.member.mailbox
        assert mailbox is not None
        request = work_request(task)
        pending = mailbox.put(request)
        self.payload.add(encoded_size(request), 0)
        key = key_of(pending)
        with self._lock:
            self._pending[key] = pending
        try:
            if not pending.done.wait(self._rpc_timeout):
                mailbox.withdraw(pending, f"no result within {self._rpc_timeout:g}s")
        finally:
            with self._lock:
                self._pending.pop(key, None)
        _raise_failure(pending)
        assert pending.result is not None
        self.payload.add(0, encoded_size(pending.result))
        return task_result(pending.result, task)

    def _session_call(self, method: str, request: Any, quick: bool = False) -> Any:
        """A session call carried through the mailbox (see wire.node_calls): the node
        leases it, runs it and submits the answer."""
        mailbox = self.member.mailbox
        assert mailbox is not None
        call = ttypes.NodeCall(call_id=runtime.token_hex(16), method=method,
                               request=node_calls.encode(request))
        pending = mailbox.put(call=call)
        timeout = QUICK_CALL_SECONDS if quick else self._rpc_timeout
        if not pending.done.wait(timeout):
            mailbox.withdraw(pending, f"{method}: no answer within {timeout:g}s")
        _raise_failure(pending)
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
                    message="cancelled by the coordinator", node_id=self.member.name)
                self.member.mailbox.withdraw(pending, None)

    def ping(self, warm_up: str | None = None) -> NodePing:
        raise NodeUnavailable(f"{self.member.name} is a pull node: it calls in, takes no pings")

    def check_run(self, query: RunQuery) -> None:
        """A pull node takes no calls: it checks itself with its first unit."""
        return None

    def forget_connections(self) -> None:
        """No connections of its own."""

    def close(self) -> None:
        """No connections of its own."""


def _raise_failure(pending: Pending) -> None:
    if pending.unfit:
        raise NodeUnfit(pending.unfit)
    if pending.unreached:
        raise NodeUnavailable(pending.unreached)
    if pending.failure:
        raise AttemptAborted(pending.failure)
    if pending.error:
        raise NodeRefused(pending.error)


class PullNodeHandle(NodeHandle):
    """A pull node as the round engine sees it; its liveness is the member's, fed by
    the node's own heartbeats and leases."""

    def __init__(self, index: int, member: Member, rpc_timeout: float) -> None:
        super().__init__(index, member.name, PullNodeClient(member, rpc_timeout))
        self.member = member
        self.liveness = member.liveness

    def holds(self, client: str | None) -> bool:
        """A pull node is never asked at the run check: it holds the clients it announced
        when it registered (--clients), or every one."""
        held = self.member.held
        if client is None or held is None:
            return True
        index = client_index_of(client)
        return index is not None and index in held

    def train(self, task: Task) -> TaskResult:
        """The unit through the node's mailbox. The node is heard when it leases and
        submits, not here: a unit the coordinator withdrew ends without a word from it."""
        return self.client.train(task)

    def can_be_told(self) -> bool:
        """Its cancels go to its mailbox, which never blocks."""
        return True

    def heartbeat(self) -> None:
        """Pull nodes call in; nothing to send them."""
