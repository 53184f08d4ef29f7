"""One round of work units over the compute nodes: threads, retries, backups, quorum.

A pool of worker threads (N + 2 by default) drains a queue of units. A worker asks
the scheduling policy for an order of nodes and tries them until one accepts; if
all refuse, the unit goes back to the queue. A node that does not answer is
benched and the unit is retried elsewhere; a unit that fails too often is
discarded. Results are folded into the algorithm's running weighted average as
they arrive. When the queue is empty, idle workers start a backup attempt of a
unit that has been out much longer than units usually take (a unit sitting in a
node's load delay, or a straggler); the first result wins and the other attempt
is cancelled. The round ends when `quorum` units are in.
"""

from __future__ import annotations

import functools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from thrift.Thrift import TException

from coordinator.ledger import UnitLedger
from coordinator.node_pool import NodeHandle
from coordinator.policies import Policy
from coordinator.progress import RunProgress
from training.algorithms.base import UnitSpec, WeightedAverage, Weights
from wire.generated import ttypes
from wire.rpc import ConnectionFailed
from wire.tensor_codec import CodecError, wire_to_dict

log = logging.getLogger("coordinator.engine")

WAIT_STEP_SECONDS = 0.05  # the longest a worker sleeps before re-checking its round
OUTCOME_NAMES = {ttypes.UnitOutcome.COMPLETED: "completed",
                 ttypes.UnitOutcome.REJECTED: "rejected",
                 ttypes.UnitOutcome.CANCELLED: "cancelled"}
REJECTIONS_PER_NODE = 4  # adaptive policy: rejections of one unit before it is requeued


@dataclass(frozen=True)
class EngineSettings:
    threads: int | None = None  # None: number of nodes + 2
    speculation: bool = True
    speculate_after: float | None = None  # backup threshold floor; None: the policy's
    max_unit_failures: int = 3
    grace_seconds: float = 30.0
    deterministic: bool = False


class RoundFailed(Exception):
    """The round cannot finish: no node reachable, or every unit failed."""

    def __init__(self, message: str, nodes_tried: list[str]) -> None:
        super().__init__(message)
        self.nodes_tried = nodes_tried


class RunCancelledError(Exception):
    """The run was cancelled while a round was in progress."""


class FatalNodeError(Exception):
    """A node refused the protocol itself; retrying elsewhere would not help."""


@dataclass
class RoundOutcome:
    average: Weights
    completed: int
    discarded: list[str]
    train_loss: float


@dataclass
class _Unit:
    index: int
    spec: UnitSpec
    attempts: int = 0
    failures: int = 0
    reserved: int = 0  # workers holding the unit (primary and backup)
    started: dict[int, tuple[NodeHandle, float]] = field(default_factory=dict)
    done: bool = False
    discarded: bool = False
    last_error: str = ""


RequestBuilder = Callable[[UnitSpec, int], ttypes.WorkRequest]


class RoundEngine:
    """Runs rounds for one run; see the module docstring."""

    def __init__(self, run_id: str, nodes: list[NodeHandle], policy: Policy,
                 settings: EngineSettings, progress: RunProgress,
                 cancelled: threading.Event, ledger: UnitLedger | None = None) -> None:
        self.run_id = run_id
        self.ledger = ledger or UnitLedger(None, run_id)
        self.nodes = nodes
        self._by_index = {node.index: node for node in nodes}
        self.policy = policy
        self.settings = settings
        self.progress = progress
        self.cancelled = cancelled
        self._fast_durations: deque[float] = deque(maxlen=64)  # recent undelayed unit times
        self._durations_lock = threading.Lock()
        self._last_contact = time.monotonic()

    def run_round(self, round_index: int, units: list[UnitSpec], quorum: int,
                  build_request: RequestBuilder) -> RoundOutcome:
        state = _RoundState(round_index, units, quorum, self.settings.deterministic,
                            max_attempts=2 * len(self.nodes))
        threads = self.settings.threads or len(self.nodes) + 2
        # Backup attempts get workers of their own: when every queue worker waits on a
        # unit sitting in a load delay, these can still start the backups that free them.
        backup_threads = len(self.nodes) if self.settings.speculation else 0
        workers = [threading.Thread(target=self._worker, args=(state, build_request, i >= threads),
                                    name=f"round{round_index}-worker{i}", daemon=True)
                   for i in range(threads + backup_threads)]
        for worker in workers:
            worker.start()
        try:
            self._wait(state)
        finally:
            state.finish()
            self._cancel_leftovers(state)
            for worker in workers:
                worker.join(timeout=WAIT_STEP_SECONDS)
        return state.outcome()

    # -------------------------------------------------------------- main wait
    def _wait(self, state: _RoundState) -> None:
        while not state.wait_finished(WAIT_STEP_SECONDS):
            if self.cancelled.is_set():
                raise RunCancelledError("run cancelled")
            if state.fatal:
                raise state.fatal
            silent = time.monotonic() - self._last_contact
            if silent > self.settings.grace_seconds and not state.has_live_attempts():
                names = [n.name for n in self.nodes]
                raise RoundFailed(
                    f"no compute node answered for {silent:.0f}s (grace period "
                    f"{self.settings.grace_seconds:.0f}s); tried {', '.join(names)}", names)
        if state.completed == 0:
            raise RoundFailed(f"every unit of round {state.round_index} failed; last error: "
                              f"{state.last_error}", [n.name for n in self.nodes])

    # ---------------------------------------------------------------- workers
    def _worker(self, state: _RoundState, build_request: RequestBuilder,
                backups_only: bool) -> None:
        """Take units until the round is over. Any unexpected error fails the round
        loudly rather than leaving it to wait for a worker that has died."""
        try:
            while True:
                unit = state.next_unit(self._backup_after(), backups_only)
                if unit is None:
                    return
                try:
                    self._try_nodes(state, unit, build_request)
                finally:
                    state.release(unit)
        except FatalNodeError as exc:
            state.fail(exc)
        except Exception as exc:
            log.exception("round %d: worker failed", state.round_index)
            state.fail(exc)

    def _backup_after(self) -> float | None:
        if not self.settings.speculation:
            return None
        with self._durations_lock:
            recent = list(self._fast_durations)
        typical = statistics.median(recent) if recent else None
        return self.policy.backup_after(typical, self.settings.speculate_after)

    def _try_nodes(self, state: _RoundState, unit: _Unit, build_request: RequestBuilder) -> None:
        order = self._order(state, unit)
        if not order:
            state.requeue(unit, wait_seconds=self._until_unbenched(time.monotonic()))
            return
        for index in self._candidates(state, unit, order):
            if state.is_over(unit):
                return
            answer = self._attempt(state, unit, self._by_index[index], build_request)
            if answer != "rejected":
                return
        state.requeue(unit, wait_seconds=WAIT_STEP_SECONDS)  # every node refused: back off

    def _order(self, state: _RoundState, unit: _Unit) -> list[int]:
        """The policy's order over the nodes not already holding this unit.

        When every node holds an attempt (each one sitting in a load delay, say), all
        nodes are candidates again: a new attempt is a fresh draw of the node's load.
        """
        now = time.monotonic()
        busy = state.nodes_of(unit)
        views = [n.view(now) for n in self.nodes]
        free = [v for v in views if v.index not in busy]
        return self.policy.order(free or views)

    def _candidates(self, state: _RoundState, unit: _Unit, order: list[int]) -> Iterator[int]:
        """Nodes to try in turn until one accepts.

        Policies 1 and 2 walk their order once (the assignment's "next node"). The
        adaptive policy asks again after each rejection: a rejection is a fresh draw,
        so trying the best node again can beat falling through to a node that is
        likely to leave the unit waiting in a load delay.
        """
        if not self.policy.rerank_after_rejection:
            yield from order
            return
        for _ in range(REJECTIONS_PER_NODE * len(self.nodes)):
            yield order[0]
            order = self._order(state, unit)
            if not order:
                return

    def _until_unbenched(self, now: float) -> float:
        soonest = min(n.benched_until() for n in self.nodes)
        return min(max(soonest - now, 0.0), WAIT_STEP_SECONDS * 4)

    def _attempt(self, state: _RoundState, unit: _Unit, node: NodeHandle,
                 build_request: RequestBuilder) -> str:
        attempt = state.start_attempt(unit, node)
        self.ledger.started(state.round_index, unit.spec.unit_id, attempt, node.name)
        log.debug("round %d: unit %s attempt %d to %s", state.round_index, unit.spec.unit_id,
                  attempt, node.name)
        node.started()
        self.progress.add(in_flight=1)
        began = time.monotonic()
        try:
            result = node.train(build_request(unit.spec, attempt))
        except ttypes.VersionMismatch as exc:
            self._failed(state, unit, attempt, node, began, bench=False, reason=exc.message)
            raise FatalNodeError(f"{node.name}: {exc.message}") from exc
        except ttypes.InvalidRequest as exc:
            self._failed(state, unit, attempt, node, began, bench=False, reason=exc.message)
            return "failed"
        except (ConnectionFailed, TException, OSError) as exc:
            self._failed(state, unit, attempt, node, began, bench=True, reason=str(exc))
            return "failed"
        finally:
            self.progress.add(in_flight=-1)
        return self._answered(state, unit, attempt, node, result, time.monotonic() - began)

    def _answered(self, state: _RoundState, unit: _Unit, attempt: int, node: NodeHandle,
                  result: ttypes.TrainResult, seconds: float) -> str:
        self._last_contact = time.monotonic()
        node.finished(result, seconds)
        state.end_attempt(unit, attempt)
        log.debug("round %d: unit %s attempt %d on %s: outcome %d after %.3fs (delay %.2fs)",
                  state.round_index, unit.spec.unit_id, attempt, node.name, result.outcome,
                  seconds, result.delay_seconds)
        self.ledger.node_answer(node.name, OUTCOME_NAMES[result.outcome],
                                result.delay_seconds > 0, result.num_samples)
        record = functools.partial(self.ledger.finished, state.round_index, unit.spec.unit_id,
                                   attempt, node.name)
        if result.outcome == ttypes.UnitOutcome.REJECTED:
            self.progress.add(rejected=1)
            record("pending", "rejected")
            return "rejected"
        if result.outcome != ttypes.UnitOutcome.COMPLETED:
            record("cancelled" if state.is_over(unit) else "pending", result.message)
            return "cancelled"
        try:
            update = wire_to_dict(result.update)
        except CodecError as exc:
            reason = f"invalid result from {node.name}: {exc}"
            discarded = state.record_failure(unit, reason, self.settings.max_unit_failures)
            record("discarded" if discarded else "failed", reason)
            return "failed"
        if result.delay_seconds == 0:
            # The node's own compute time, not the call time: queueing behind other
            # units on a busy node must not raise the bar for starting a backup.
            with self._durations_lock:
                self._fast_durations.append(result.compute_seconds)
        if state.complete(unit, update, result):
            record("completed")
            self.progress.add(units_done=1)
            self._cancel_others(unit, node)
        else:
            record("cancelled", "another attempt finished first")
        return "completed"

    def _failed(self, state: _RoundState, unit: _Unit, attempt: int, node: NodeHandle,
                began: float, bench: bool, reason: str) -> None:
        log.warning("unit %s on %s failed: %s", unit.spec.unit_id, node.name, reason)
        node.failed(time.monotonic() - began, bench=bench)
        state.end_attempt(unit, attempt)
        self.progress.add(failed=1)
        self.ledger.node_failure(node.name, reason)
        discarded = state.record_failure(unit, f"{node.name}: {reason}",
                                         self.settings.max_unit_failures)
        self.ledger.finished(state.round_index, unit.spec.unit_id, attempt, node.name,
                             "discarded" if discarded else "failed", reason)
        if discarded:
            log.error("unit %s discarded after %d failures", unit.spec.unit_id, unit.failures)

    def _cancel_others(self, unit: _Unit, winner: NodeHandle) -> None:
        for node in {n for n, _ in unit.started.copy().values() if n is not winner}:
            node.cancel(self.run_id, unit.spec.unit_id)

    def _cancel_leftovers(self, state: _RoundState) -> None:
        for unit in state.units:
            for node in {n for n, _ in unit.started.copy().values()}:
                node.cancel(self.run_id, unit.spec.unit_id)


class _RoundState:
    """The queue and unit states of one round, under one condition variable."""

    def __init__(self, round_index: int, units: list[UnitSpec], quorum: int,
                 deterministic: bool, max_attempts: int) -> None:
        self.round_index = round_index
        self.max_attempts = max_attempts  # live attempts of one unit at once
        self.units = [_Unit(i, spec) for i, spec in enumerate(units)]
        self.quorum = min(quorum, len(units))
        self.average = WeightedAverage(deterministic)
        self.completed = 0
        self.fatal: Exception | None = None
        self.last_error = ""
        self._losses: list[tuple[float, int]] = []
        self._queue: deque[_Unit] = deque(self.units)
        self._cond = threading.Condition()
        self._over = False

    # ------------------------------------------------------------ scheduling
    def next_unit(self, backup_after: float | None, backups_only: bool = False) -> _Unit | None:
        """A unit to work on: queued first, then a backup of a slow one; None when over."""
        with self._cond:
            while not self._over:
                if not self._queue:
                    self._requeue_orphans()
                if self._queue and not backups_only:
                    unit = self._queue.popleft()
                    unit.reserved += 1
                    return unit
                backup = self._slow_unit(backup_after)
                if backup is not None:
                    backup.reserved += 1
                    return backup
                self._cond.wait(WAIT_STEP_SECONDS)
            return None

    def _requeue_orphans(self) -> None:
        """Put back any unsettled unit that nobody holds, so no path can lose a unit."""
        for unit in self.units:
            if not (unit.done or unit.discarded or unit.reserved or unit in self._queue):
                log.warning("round %d: unit %s was held by nobody; queued again",
                            self.round_index, unit.spec.unit_id)
                self._queue.append(unit)

    def _slow_unit(self, backup_after: float | None) -> _Unit | None:
        """The unit whose newest attempt has been out longest, if that is over the threshold.

        Only units whose every holder is waiting on a node qualify, and a unit never
        holds more attempts than there are nodes, so backups cannot pile up.
        """
        if backup_after is None:
            return None
        now = time.monotonic()
        slow = [u for u in self.units
                if not u.done and not u.discarded and u.started
                and u.reserved == len(u.started) < self.max_attempts
                and now - max(t for _, t in u.started.values()) > backup_after]
        return min(slow, key=lambda u: max(t for _, t in u.started.values()), default=None)

    def requeue(self, unit: _Unit, wait_seconds: float) -> None:
        with self._cond:
            if not unit.done and not unit.discarded and unit.reserved == 1:
                self._queue.append(unit)
            if wait_seconds > 0:
                self._cond.wait(wait_seconds)

    def release(self, unit: _Unit) -> None:
        with self._cond:
            unit.reserved -= 1
            self._cond.notify_all()

    def nodes_of(self, unit: _Unit) -> set[int]:
        with self._cond:
            return {node.index for node, _ in unit.started.values()}

    def has_live_attempts(self) -> bool:
        with self._cond:
            return any(u.started for u in self.units)

    def is_over(self, unit: _Unit) -> bool:
        with self._cond:
            return self._over or unit.done or unit.discarded

    # --------------------------------------------------------------- attempts
    def start_attempt(self, unit: _Unit, node: NodeHandle) -> int:
        with self._cond:
            unit.attempts += 1
            unit.started[unit.attempts] = (node, time.monotonic())
            return unit.attempts

    def end_attempt(self, unit: _Unit, attempt: int) -> None:
        with self._cond:
            unit.started.pop(attempt, None)

    def record_failure(self, unit: _Unit, reason: str, max_failures: int) -> bool:
        """Count a failure; requeue the unit, or discard it past the limit (True)."""
        with self._cond:
            unit.failures += 1
            unit.last_error = self.last_error = reason
            if unit.failures >= max_failures and not unit.started:
                unit.discarded = True
            elif not unit.done and unit not in self._queue:
                self._queue.appendleft(unit)
            self._check_over()
            self._cond.notify_all()
            return unit.discarded

    def complete(self, unit: _Unit, update: Weights, result: ttypes.TrainResult) -> bool:
        """Fold a result in if it is the unit's first and the round still runs."""
        with self._cond:
            if unit.done or self._over:
                return False
            unit.done = True
        self.average.add(unit.index, update, result.num_samples)
        with self._cond:
            self.completed += 1
            self._losses.append((result.loss, result.num_samples))
            self._check_over()
            self._cond.notify_all()
        return True

    def _check_over(self) -> None:
        settled = sum(1 for u in self.units if u.done or u.discarded)
        if self.completed >= self.quorum or settled == len(self.units):
            self._over = True

    # ------------------------------------------------------------------- end
    def wait_finished(self, timeout: float) -> bool:
        with self._cond:
            if not self._over and self.fatal is None:
                self._cond.wait(timeout)
            return self._over and self.fatal is None

    def fail(self, exc: Exception) -> None:
        with self._cond:
            self.fatal = exc
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._over = True
            self._cond.notify_all()

    def outcome(self) -> RoundOutcome:
        samples = sum(n for _, n in self._losses)
        loss = sum(loss * n for loss, n in self._losses) / samples if samples else float("nan")
        discarded = [u.spec.unit_id for u in self.units if u.discarded]
        return RoundOutcome(self.average.result(), self.completed, discarded, loss)
