"""Pushed compute nodes over Thrift: the NodeClient the coordinator dials.

Where the wire's errors of calls to a node (wire.errors) become the coordinator's own
(engine.nodes.errors), and where tasks and results become Thrift structs and back.
Session calls are built here too, by `SessionRequests`; the pull and in-process clients
share these (their calls carry the same structs without a socket).
"""

from __future__ import annotations

import abc
import contextlib
import json
from typing import Any

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.client import AttemptKey, NodePing, RunAnswer, RunQuery
from thrift_trainer.engine.nodes.errors import (
    AnswerTooLarge,
    AttemptAborted,
    InvalidResult,
    NodeError,
    NodeIncompatible,
    NodeRefused,
    NodeRemoteError,
    NodeTimedOut,
    NodeUnavailable,
    NodeUnfit,
)
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.sent_weights import SentWeights
from thrift_trainer.engine.records import NodeSummary, fields_of
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus, Tensors
from thrift_trainer.training.run_check import RunFacts
from thrift_trainer.wire.errors import (
    CALL_ERRORS,
    BadRequest,
    CallTimedOut,
    ConnectionFailed,
    MessageTooLarge,
    TooLargeForPeer,
    WrongVersion,
    mapped,
    wire_error,
)
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.rpc import ConnectionPool, transport_of
from thrift_trainer.wire.stats import PayloadBytes
from thrift_trainer.wire.tensor_codec import CodecError, dict_to_wire, specs_to_wire, wire_to_dict
from thrift_trainer.wire.transport import LARGE_WRITE_BYTES

CONTROL_TIMEOUT_SECONDS = 5.0
_STATUS = {ttypes.UnitOutcome.COMPLETED: TaskStatus.COMPLETED,
           ttypes.UnitOutcome.REJECTED: TaskStatus.REJECTED,
           ttypes.UnitOutcome.CANCELLED: TaskStatus.CANCELLED}


def work_request(task: Task, cached: bool = False) -> ttypes.WorkRequest:
    """A task as the Thrift request a node runs; ``cached``: without its weights, which
    the node kept from an earlier unit (see engine.nodes.sent_weights)."""
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id=task.run_id, round=task.round,
        unit_id=task.unit_id, attempt=task.attempt, algorithm=task.algorithm,
        model=task.model, dataset=task.dataset, unit_path=task.unit_path,
        config_json=task.config_json, weights=[] if cached else _encoded(task.weights),
        scheduling_policy=task.scheduling_policy, index_start=task.index_start,
        index_stop=task.index_stop, model_version=task.version,
        weights_cached=True if cached else None,
        part=task.share[0] if task.share else None, parts=task.share[1] if task.share else None,
        expected_update=None if task.expected_update is None
        else specs_to_wire(task.expected_update), client=task.client,
        kind=None if task.kind == "train" else task.kind,  # as before for training units
        secure_aggregation=task.secure_aggregation)


def run_check_request(query: RunQuery) -> ttypes.RunCheckRequest:
    return ttypes.RunCheckRequest(protocol_version=PROTOCOL_VERSION, run_id=query.run_id,
                                  algorithm=query.algorithm, model=query.model,
                                  dataset=query.dataset, config_json=query.config_json)


def run_answer(answer: ttypes.RunCheck) -> RunAnswer:
    if not answer.ok:
        return RunAnswer(problem=answer.problem or "cannot serve the run")
    if not answer.model_fingerprint:  # no torch model, or a relay whose members it could
        # not ask: nothing to compare, but the clients it holds (a GAN's clients) count
        return RunAnswer() if answer.clients is None else RunAnswer(RunFacts(
            dict(answer.plugins or {}), clients=tuple(answer.clients)))
    return RunAnswer(RunFacts(dict(answer.plugins or {}), answer.model_fingerprint,
                              answer.data_fingerprint or "", answer.data_size or 0,
                              answer.partition_fingerprint or "",
                              None if answer.clients is None else tuple(answer.clients),
                              own_sizes=dict(answer.client_sizes or {}),
                              own_labels=_own_labels(answer),
                              own_fingerprints=dict(answer.client_fingerprints or {})))


def _own_labels(answer: ttypes.RunCheck) -> dict[str, dict[int, int] | None]:
    """Node-resident clients' label counts as their node announced them (JSON), where it
    did; a malformed announcement counts as none."""
    return {name: _label_counts(text) for name, text in (answer.client_labels or {}).items()}


def _label_counts(text: str) -> dict[int, int] | None:
    try:
        return {int(label): int(n) for label, n in json.loads(text).items()}
    except (ValueError, TypeError, AttributeError):
        return None


class _LastEncoded:
    """The Tensor list of the weights dict encoded last: every unit of a sync round
    shares one dict, so it is encoded once per round, not once per unit. The Tensors
    view the arrays' memory (no copy) and are only read while requests are written;
    small ones are copied, once, into the bytes that Thrift's C encoder takes, so that a
    request of a small model is encoded in C without copying them again (wire.c_codec)."""

    def __init__(self) -> None:
        self._lock = runtime.Lock()
        self._weights: Tensors | None = None  # kept alive, so its id is never reused
        self._tensors: list[ttypes.Tensor] = []

    def __call__(self, weights: Tensors) -> list[ttypes.Tensor]:
        with self._lock:
            if weights is self._weights:
                return self._tensors
        tensors = dict_to_wire(weights, copy_under=LARGE_WRITE_BYTES)
        with self._lock:
            self._weights, self._tensors = weights, tensors
        return tensors


_encoded = _LastEncoded()


def task_result(result: ttypes.TrainResult, task: Task) -> TaskResult:
    """A node's Thrift answer to `task`; NodeRemoteError for an outcome not known here,
    InvalidResult for an update whose tensors cannot be decoded."""
    if result.outcome == ttypes.UnitOutcome.UNFIT:
        raise NodeUnfit(result.message or "the node cannot serve this run")
    try:
        status = _STATUS[result.outcome]
    except KeyError:
        raise NodeRemoteError(f"unknown unit outcome {result.outcome!r}") from None
    try:
        update = wire_to_dict(result.update or [])
    except CodecError as exc:
        raise InvalidResult(f"invalid result: {exc}") from None
    return TaskResult(status=status, update=update,
                      num_samples=result.num_samples, model_version=task.version,
                      loss=result.loss, error=result.error,
                      compute_seconds=result.compute_seconds,
                      delay_seconds=result.delay_seconds, message=result.message,
                      node_id=result.node_id, loss_before=result.loss_before,
                      secure_aggregation=result.secure_aggregation)


def node_error(exc: BaseException) -> NodeError:
    """The coordinator's exception for a failed call to a node."""
    if isinstance(exc, NodeError):
        return exc
    error = wire_error(exc)
    if isinstance(error, ConnectionFailed):
        return NodeUnavailable(str(error))
    if isinstance(error, WrongVersion):
        return NodeIncompatible(str(error))
    if isinstance(error, BadRequest):
        return NodeRefused(str(error))
    if isinstance(error, TooLargeForPeer):  # its limit: it cannot take this run's tensors
        return NodeUnfit(error.refusal)
    if isinstance(error, MessageTooLarge):  # our limit, not the node's failure
        return AnswerTooLarge(str(error))
    if isinstance(error, CallTimedOut):
        return NodeTimedOut(str(error))
    return NodeRemoteError(str(error))


def mapped_errors() -> contextlib.AbstractContextManager[None]:
    """Raise the coordinator's exception for a Thrift or socket error inside."""
    return mapped(node_error)


class SessionRequests(abc.ABC):
    """Session calls as Thrift requests; subclasses carry them with `_session_call`."""

    @abc.abstractmethod
    def _session_call(self, method: str, request: Any, quick: bool = False) -> Any:
        """Run the ComputeNode `method` with `request`; raises NodeError."""

    def _acked(self, method: str, request: Any, quick: bool = False) -> int:
        ack = self._session_call(method, request, quick)
        if not ack.ok:
            raise NodeRefused(ack.message)
        return ack.bytes

    def send_session(self, run_id: str, session: str, target: NodeAddress,
                     target_session: str, swap_id: int) -> int:
        return self._acked("send_session", ttypes.SendSessionRequest(
            protocol_version=PROTOCOL_VERSION, run_id=run_id, session=session,
            target_host=target.host, target_port=target.port, target_session=target_session,
            swap_id=swap_id))

    def export_session(self, run_id: str, session: str) -> Any:
        return self._session_call("export_session", ttypes.SessionRequest(
            protocol_version=PROTOCOL_VERSION, run_id=run_id, session=session)).tensors

    def import_session(self, run_id: str, session: str, swap_id: int, state: Any) -> int:
        return self._acked("import_session", ttypes.ImportSessionRequest(
            protocol_version=PROTOCOL_VERSION, run_id=run_id, session=session,
            swap_id=swap_id, tensors=state))

    def drop_sessions(self, run_id: str) -> None:
        self._session_call("drop_sessions", ttypes.DropSessionsRequest(
            protocol_version=PROTOCOL_VERSION, run_id=run_id), quick=True)


class ThriftNodeClient(SessionRequests):
    """A node the coordinator dials: pooled work connections (long read timeout) and
    control connections (short), and the transports of calls in progress, to abort."""

    accepts_connections = True

    def __init__(self, address: NodeAddress, rpc_timeout: float,
                 connect_timeout: float) -> None:
        self.address: NodeAddress | None = address
        self.payload = PayloadBytes()
        self.sent_weights = SentWeights()  # what the node holds: later units may refer to it
        self._lock = runtime.Lock()
        self._calls: dict[AttemptKey, Any] = {}  # attempt -> its transport
        self._aborted: dict[AttemptKey, str] = {}
        self._work = ConnectionPool(ComputeNode.Client, address.host, address.port,
                                    connect_timeout=connect_timeout, read_timeout=rpc_timeout)
        self._control = ConnectionPool(ComputeNode.Client, address.host, address.port,
                                       connect_timeout=connect_timeout,
                                       read_timeout=CONTROL_TIMEOUT_SECONDS)

    def train(self, task: Task) -> TaskResult:
        key = task.key
        try:
            with self._work.client() as client:
                transport = transport_of(client)
                with self._lock:
                    self._calls[key] = transport
                # One call at a time per connection: the counts' growth is this call's frames.
                sent, received = transport.bytes_sent, transport.bytes_received
                try:
                    return task_result(self._train_call(client, task), task)
                finally:
                    with self._lock:
                        self._calls.pop(key, None)
                    self.payload.add(transport.bytes_sent - sent,
                                     transport.bytes_received - received)
        except CALL_ERRORS as exc:
            reason = self._take_abort(key)
            if reason:
                raise AttemptAborted(reason) from exc
            raise node_error(exc) from exc
        finally:
            self._take_abort(key)

    def _train_call(self, client: Any, task: Task) -> ttypes.TrainResult:
        """The node's answer to ``task``, sent without its weights when the node already
        holds them; a node that turns out not to (NEED_WEIGHTS) gets them at once, on the
        same connection, so the engine never sees the difference."""
        if self.sent_weights.refers(task):
            result = client.train_with_weights(work_request(task, cached=True))
            if result.outcome != ttypes.UnitOutcome.NEED_WEIGHTS:
                return result
            self.sent_weights.lost(task)
        self.sent_weights.sending(task)
        result = client.train_with_weights(work_request(task))
        if result.outcome == ttypes.UnitOutcome.COMPLETED:
            self.sent_weights.completed(task)
        return result

    def abort(self, key: AttemptKey, reason: str) -> bool:
        with self._lock:
            transport = self._calls.get(key)
            if transport is None:
                return False
            self._aborted[key] = reason
        transport.interrupt()
        return True

    def _take_abort(self, key: AttemptKey) -> str | None:
        with self._lock:
            return self._aborted.pop(key, None)

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        with mapped_errors(), self._control.client() as client:
            client.cancel_unit(ttypes.CancelUnitRequest(run_id=run_id, unit_id=unit_id,
                                                        attempt=attempt))

    def ping(self, warm_up: str | None = None) -> NodePing:
        with mapped_errors(), self._control.client() as client:
            info = client.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION,
                                                  warm_up=warm_up))
        return NodePing(list(info.delaying or []), dict(info.progress or {}),
                        bool(info.warming_up), info.role,
                        [summary_from_wire(m) for m in info.members or []])

    def check_run(self, query: RunQuery) -> RunAnswer:
        """On a work connection: the node may load its data and build the model first."""
        with mapped_errors(), self._work.client() as client:
            return run_answer(client.check_run(run_check_request(query)))

    def _session_call(self, method: str, request: Any, quick: bool = False) -> Any:
        """On a work connection by default, whose long read timeout covers a node-to-node
        send; ``quick`` uses a control connection (short timeout)."""
        with mapped_errors(), (self._control if quick else self._work).client() as client:
            return getattr(client, method)(request)

    def drop_sessions(self, run_id: str) -> None:
        self.sent_weights.forget_run(run_id)  # the node drops the run's weights too
        super().drop_sessions(run_id)

    def forget_connections(self) -> None:
        self.sent_weights.clear()  # a restarted node holds no weights
        for pool in (self._work, self._control):
            pool.discard_idle()

    def close(self) -> None:
        self._work.close()
        self._control.close()


def pushed_node(index: int, address: NodeAddress, rpc_timeout: float,
                connect_timeout: float) -> NodeHandle:
    """The engine's handle of a node the coordinator dials."""
    return NodeHandle(index, str(address), ThriftNodeClient(address, rpc_timeout,
                                                            connect_timeout))


def node_summary(summary: NodeSummary) -> ttypes.NodeSummary:
    """The wire form, a relay's members (a tree) included."""
    members = [node_summary(member) for member in summary.members]
    return ttypes.NodeSummary(**{**fields_of(summary), "members": members or None})


def summary_from_wire(summary: ttypes.NodeSummary) -> NodeSummary:
    """A node summary back from the wire (a relay's member), members and all."""
    return NodeSummary(
        node=summary.node, accepted=summary.accepted, rejected=summary.rejected,
        delayed=summary.delayed, failed=summary.failed, cancelled=summary.cancelled,
        samples=summary.samples or 0, busy_seconds=summary.busy_seconds,
        compute_seconds=summary.compute_seconds or 0.0,
        delay_seconds=summary.delay_seconds or 0.0, state=summary.state or "alive",
        silent_seconds=summary.silent_seconds, pull=bool(summary.pull), role=summary.role,
        members=[summary_from_wire(m) for m in summary.members or []], note=summary.note,
        refused=summary.refused)
