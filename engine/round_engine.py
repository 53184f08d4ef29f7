"""One round of work units over the compute nodes: threads, retries, backups, quorum.

A pool of worker threads (N + 2 by default) drains a queue of units. A worker asks
the scheduling policy for an order of nodes and tries them until one accepts; if
all refuse, the unit goes back to the queue. A node that does not answer is
benched and the unit is retried elsewhere; a unit that fails too often is
discarded. Each result passes the round's update filters (engine/update_filters.py)
and is kept; the round returns them, in unit order, with the units it gave up, and the
algorithm aggregates them. When the queue is empty, idle workers (and N workers kept
for this alone) start a backup attempt of a unit that has been out much longer than units
usually take (a unit sitting in a node's load delay, or a straggler); the first
result wins and the other attempts are cancelled. The round ends when `quorum`
units are in. The queue, attempts and failure counts live in `work_queue`, settled by a round's
barrier (`round_state`) or a stream's buffer (`stream_state`); deadlines, backup
thresholds and re-issue in `stragglers`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass

from thrift_trainer.engine import runtime
from thrift_trainer.engine.attempt_log import AttemptEnd, AttemptLog
from thrift_trainer.engine.cancels import CancelSender, shared_sender
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.nodes.errors import (
    AnswerTooLarge,
    AttemptAborted,
    NodeError,
    NodeIncompatible,
    NodeRefused,
    NodeUnavailable,
    NodeUnfit,
)
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.quorum import NodeGate, NodeMinimum
from thrift_trainer.engine.policies import Policy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_state import RoundOutcome, RoundState
from thrift_trainer.engine.stragglers import StragglerPolicy
from thrift_trainer.engine.stream_records import RoundEnd, VersionDue
from thrift_trainer.engine.stream_state import StreamState
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.engine.update_filters import (
    DEFAULT_FILTERS,
    Candidate,
    RoundView,
    UpdateFilter,
    decoded,
    run_filters,
)
from thrift_trainer.engine.work_queue import (
    WAIT_STEP_SECONDS,
    ResultSink,
    RoundFailed,
    Unit,
    WorkQueue,
)
from thrift_trainer.training.units import UnitResult, UnitSpec, Weights

log = logging.getLogger("coordinator.engine")

RECLAIM_CHECK_SECONDS = 0.5  # how often deadlines and dead nodes are checked
REJECTIONS_PER_NODE = 4  # adaptive policy: rejections of one unit before it is requeued


@dataclass(frozen=True)
class EngineSettings:
    threads: int | None = None  # None: number of nodes + 2
    speculation: bool = True
    speculate_after: float | None = None  # backup threshold floor; None: the policy's
    max_unit_failures: int = 3
    grace_seconds: float = 30.0
    deterministic: bool = False  # K-of-N rounds run their first K units (see run_round)
    deadline_floor: float = 30.0  # a unit's deadline: factor x the usual unit time,
    deadline_factor: float = 10.0  # at least the floor ...
    deadline_cap: float = 300.0  # ... and at most the cap
    max_update_norm: float | None = 10.0  # the run's norm filter: refuse updates this many
    # times the usual norm (engine/update_filters.py)
    min_nodes: int = 1  # fewer answering nodes: pause (pause_below_min) or fail after grace
    pause_below_min: bool = False
    max_pause: float = 600.0  # longest pause before the run fails


class RunCancelledError(Exception):
    """The run was cancelled while a round was in progress."""


class FatalNodeError(Exception):
    """A node refused the protocol itself; retrying elsewhere would not help."""


def no_node_can_serve(nodes: Sequence[NodeHandle]) -> str:
    """The one line of a run that no node can serve, each node with its reason."""
    reasons = "; ".join(f"node {n.name} {n.left_out}" for n in nodes)
    return f"no node can serve this run: {reasons}"


TaskBuilder = Callable[[UnitSpec, int], Task]


def may_compute(node: NodeHandle, spec: UnitSpec) -> bool:
    """Whether ``node`` may compute the unit: it holds the unit's client, and is the unit's
    only node when it has one."""
    return node.holds(spec.client) and (spec.only_node is None or node.name == spec.only_node)


class RoundEngine:
    """Runs rounds for one run; see the module docstring."""

    def __init__(self, run_id: str, nodes: list[NodeHandle], policy: Policy,
                 settings: EngineSettings, progress: RunProgress,
                 cancelled: runtime.EventLike, ledger: UnitLedger | None = None,
                 cancels: CancelSender | None = None,
                 refresh_nodes: Callable[[], list[NodeHandle] | None] = lambda: None,
                 on_left_out: Callable[[NodeHandle], None] = lambda node: None,
                 recheck_nodes: Callable[[], None] = lambda: None) -> None:
        """``refresh_nodes``: called at each reclaim check of a round or stream to take in
        nodes that joined or left (file, registrations), None when none did: a node that
        registers mid-round (a lone pull node that restarted) takes that round's queued
        units; ``on_left_out``: told of a node that cannot serve the run (NodeUnfit), so
        that it stays out of later rounds too (the engine stops using it at once);
        ``recheck_nodes``: called every few seconds while units
        run, to ask nodes that came back which federated clients they hold (a stream whose
        holders were all away has no round end to wait for)."""
        self.run_id = run_id
        self.cancels = cancels or shared_sender()
        self.ledger = ledger or UnitLedger(None, run_id)
        self.log = AttemptLog(self.ledger, progress)
        self._by_index: dict[int, NodeHandle] = {}
        self.set_nodes(nodes)
        self.policy = policy
        self.settings = settings
        self.progress = progress
        self.cancelled = cancelled
        # deadlines, backups and re-issue of late units
        self.stragglers = StragglerPolicy(settings, policy, run_id, self.cancels)
        self._last_contact = runtime.monotonic()
        self.gate = NodeGate(NodeMinimum(settings.min_nodes, settings.pause_below_min,
                                         settings.max_pause, settings.grace_seconds), progress)
        self.refresh_nodes = refresh_nodes
        self.on_left_out = on_left_out
        self.recheck_nodes = recheck_nodes
        self.left_out: list[NodeHandle] = []
        self._leaving = runtime.Lock()  # one worker at a time leaves a node out

    def set_nodes(self, nodes: list[NodeHandle]) -> None:
        """The nodes of the next rounds, or of this one while it is paused. Handles of
        nodes that left stay reachable by index for the attempts they still hold."""
        self.nodes = list(nodes)
        self._by_index = {**self._by_index, **{node.index: node for node in nodes}}

    def run_round(self, round_index: int, units: list[UnitSpec], quorum: int,
                  build_task: TaskBuilder,
                  filters: Sequence[UpdateFilter] = DEFAULT_FILTERS,
                  earlier_attempts: Mapping[str, int] | None = None,
                  taken_up: Mapping[str, UnitResult] | None = None,
                  keep_result: ResultSink | None = None) -> RoundOutcome:
        """Run the units until `quorum` are in; returns the results and failed units. A
        result that one of ``filters`` refuses is a failure of its node. In deterministic
        mode a K-of-N round runs its first K units only, so which results it uses does not
        depend on timing (the others are left unsettled: the ledger cancels them).
        A round a resume reopened numbers attempts after ``earlier_attempts`` and starts
        with the results ``taken_up`` (by unit id); ``keep_result`` is told of each result
        the round keeps (coordinator/kept_results.py)."""
        if self.settings.deterministic:
            units = units[:quorum]
        self._filters = list(filters)
        state = RoundState(round_index, units, quorum, max_attempts=2 * len(self.nodes),
                           earlier_attempts=earlier_attempts, taken_up=taken_up)
        state.keep_result = keep_result
        self._start_filters(state)
        # Workers are started as work appears and leave when they find none: one per
        # queued unit up to `threads`, and backup-only workers for backups due, so that a
        # backup starts even while every other worker waits on a unit in a load delay.
        # Both limits follow the nodes, which may join during the round.
        def staff() -> None:
            threads = self.settings.threads or len(self.nodes) + 2
            backup_threads = len(self.nodes) if self.settings.speculation else 0
            queued, backups = state.workers_wanted(self.stragglers.backup_after(), threads,
                                                   backup_threads)
            self._start_workers(state, build_task, f"round{round_index}", queued, backups)

        staff()
        try:
            self._wait(state, staff)
        finally:
            state.finish()
            self._stop(state)
        return state.outcome()

    def stream(self, state: StreamState, build_task: TaskBuilder,
               filters: Sequence[UpdateFilter]) -> Iterator[VersionDue | RoundEnd]:
        """Run an asynchronous run's units (engine/stream_state.py) until its last round
        ends, handing the training loop what it is to do as it comes: a `VersionDue`,
        which the loop answers with `state.applied` before asking for the next, and each
        `RoundEnd`, which it writes out while the state holds its version (the workers go
        on computing meanwhile). Close it (`contextlib.closing`) to stop the workers when
        the loop stops early."""
        self._filters = list(filters)
        state.max_in_flight = self._stream_capacity(state)
        self._start_filters(state)
        backup_threads = len(self.nodes) if self.settings.speculation else 0
        self._start_workers(state, build_task, f"stream{state.round_index}",
                            self.settings.threads or state.max_in_flight + 2, backup_threads)
        try:
            while True:
                next_check = runtime.monotonic() + RECLAIM_CHECK_SECONDS
                while (event := state.pending()) is None or isinstance(event, VersionDue):
                    if event is not None:
                        yield event
                        if state.pending() is event:
                            raise RuntimeError("the training loop did not make the version "
                                               "that was due (StreamState.applied)")
                    elif state.over:
                        break
                    else:
                        state.wait_event(WAIT_STEP_SECONDS)
                        next_check = self._tick(state, next_check)
                if state.fatal:
                    raise state.fatal
                if event is None:
                    return
                for update_filter in self._filters:
                    update_filter.end_round()
                yield event
                state.max_in_flight = self._stream_capacity(state)
                self._start_filters(state)
                state.round_written()
        finally:
            state.finish()
            self._stop(state)

    def _stream_capacity(self, state: StreamState) -> int:
        """Units a stream keeps out: each node's unit, and those sent ahead to it."""
        return max(1, len(self.nodes)) * state.schedule.units_per_node

    def _start_filters(self, state: WorkQueue) -> None:
        for update_filter in self._filters:
            update_filter.start_round(state.units_per_round(), len(self.nodes))

    def _start_workers(self, state: WorkQueue, build_task: TaskBuilder,
                       name: str, threads: int, backup_threads: int) -> None:
        for i in range(threads + backup_threads):
            runtime.start_thread(self._worker, f"{name}-worker{i}",
                                 args=(state, build_task, i >= threads))

    def _stop(self, state: WorkQueue) -> None:
        for update_filter in self._filters:
            update_filter.end_round()
        self._cancel_leftovers(state)
        # The workers are not joined. Those not in a call see the round over and end at
        # once; one still in a call for a unit the round no longer needs (a K-of-N
        # straggler, just cancelled) ends when its node answers, and the state ignores
        # what it reports then. Waiting for it here would add its tail to every round.

    # -------------------------------------------------------------- main wait
    def _wait(self, state: RoundState, staff: Callable[[], None]) -> None:
        """Wait for the round's end, a step at a time or until woken (a unit let go of
        unsettled, a failure), starting the workers it wants each time."""
        next_check = runtime.monotonic() + RECLAIM_CHECK_SECONDS
        while not state.wait_finished(WAIT_STEP_SECONDS):
            staff()
            next_check = self._tick(state, next_check)
        # a round of no unit (an empty Poisson draw of clients) has nothing to fail
        if state.completed == 0 and state.units and not state.all_dropped:
            raise RoundFailed(f"every unit of round {state.round_index} failed; last error: "
                              f"{state.last_error}", [n.name for n in self.nodes])

    def _tick(self, state: WorkQueue, next_check: float) -> float:
        """One look at a running round or stream: raise if it was cancelled, failed or no
        node answers any more; reclaim overdue attempts when ``next_check`` has come.
        Returns the time of the next reclaim check."""
        if self.cancelled.is_set():
            raise RunCancelledError("run cancelled")
        if state.fatal:
            raise state.fatal
        if runtime.monotonic() >= next_check:
            self.stragglers.reclaim(state)
            self._watch_nodes()
            next_check = runtime.monotonic() + RECLAIM_CHECK_SECONDS
        silent = runtime.monotonic() - self._last_contact
        if silent > self.settings.grace_seconds and not state.has_live_attempts():
            names = [n.name for n in self.nodes]
            raise RoundFailed(
                f"no compute node answered for {silent:.0f}s (grace period "
                f"{self.settings.grace_seconds:.0f}s); tried {', '.join(names)}", names)
        return next_check

    def _watch_nodes(self) -> None:
        """Take in nodes that joined or left, then pause, resume or fail on the minimum of
        nodes; do not count a pause against the grace period. Nodes are taken in during a
        round, not only while paused or between rounds: a run whose only node is a pull
        node that restarted would otherwise have nobody for the round's units (the new
        registration closed the old one's mailbox) and fail after the grace period."""
        joined = self.refresh_nodes()
        if joined is not None:
            self.set_nodes(joined)
        self.recheck_nodes()
        self.gate.watch(self.nodes, runtime.monotonic())
        if self.gate.paused:
            self._last_contact = runtime.monotonic()

    # ---------------------------------------------------------------- workers
    def _worker(self, state: WorkQueue, build_task: TaskBuilder,
                backups_only: bool) -> None:
        """Take units until the round is over (in a round, until none is left to take).
        Any unexpected error fails the round loudly rather than leaving it to wait for a
        worker that has died."""
        try:
            while True:
                unit = state.next_unit(self.stragglers.backup_after(), backups_only)
                if unit is None:
                    return
                try:
                    self._try_nodes(state, unit, build_task)
                finally:
                    state.release(unit)
        except FatalNodeError as exc:
            state.worker_left(backups_only)
            state.fail(exc)
        except Exception as exc:
            log.exception("round %d: worker failed", state.round_index)
            state.worker_left(backups_only)
            state.fail(exc)

    def _try_nodes(self, state: WorkQueue, unit: Unit, build_task: TaskBuilder) -> None:
        if not self.gate.wait_open(WAIT_STEP_SECONDS):  # paused: too few nodes answer
            state.requeue(unit, wait_seconds=0)
            return
        if self._no_live_holder(unit.spec):
            if state.drop(unit, f"no live node holds {unit.spec.client}"):
                log.info("round %d: %s dropped out: no live node holds it",
                         state.round_index, unit.spec.client)
            else:  # an attempt still out decides first
                state.requeue(unit, wait_seconds=WAIT_STEP_SECONDS, wait_first=True)
            return
        order = self._order(state, unit)
        if not order:  # every node it could go to is benched: wait, at least a step (the
            # soonest node back may be one that already holds the unit, which it cannot go
            # to, and waiting no time would spin a core)
            state.requeue(unit, wait_seconds=max(WAIT_STEP_SECONDS, self._until_unbenched(
                runtime.monotonic())), wait_first=unit.spec.client is not None)
            return
        for index in self._candidates(state, unit, order):
            if state.is_over(unit):
                return
            answer = self._attempt(state, unit, self._by_index[index], build_task)
            if answer == "cancelled":  # the node stopped it: queued again unless settled,
                # and this worker backs off (a node stopping may cancel each unit it gets)
                state.requeue(unit, wait_seconds=WAIT_STEP_SECONDS)
            if answer != "rejected":
                return
        state.requeue(unit, wait_seconds=WAIT_STEP_SECONDS)  # every node refused: back off

    def _order(self, state: WorkQueue, unit: Unit) -> list[int]:
        """The policy's order over the nodes not already holding this unit (in a stream,
        over those holding the fewest units).

        When every node holds an attempt (each one sitting in a load delay, say), all
        nodes are candidates again: a new attempt is a fresh draw of the node's load.
        """
        now = runtime.monotonic()
        busy = state.nodes_of(unit)
        holders = self._holders(unit, now)
        if not self.policy.ranks_by_views and not state.fills_evenly:
            return self._order_available(now, busy, holders, unit.spec)
        views = [n.view(now) for n in holders]
        free = [v for v in views if v.index not in busy]
        if state.fills_evenly and free:
            # A stream fills nodes evenly: a unit goes to a node with nothing out while
            # there is one, and is sent ahead (prefetch) only to a node with the fewest.
            fewest = min(v.in_flight for v in free)
            free = [v for v in free if v.in_flight == fewest]
        return self._preferred_first(self.policy.order(free or views), unit.spec)

    def _holders(self, unit: Unit, now: float) -> list[NodeHandle]:
        """The nodes that may compute the unit, less those it already failed on while
        another of them is alive (a node whose answers are too large for us fails every
        unit it takes, without being benched for it). Only a live one counts: a node that
        crashed or was cut off stays among a round's nodes, and a retry kept for it would
        never run."""
        holders = [n for n in self.nodes if may_compute(n, unit.spec)]
        if not unit.failed_on:
            return holders
        untried = [n for n in holders if n.index not in unit.failed_on]
        if any(n.liveness.state(now) == "alive" for n in untried):
            return untried
        return holders

    def _order_available(self, now: float, busy: Container[int], holders: list[NodeHandle],
                         spec: UnitSpec) -> list[int]:
        """`_order` for a policy that looks only at which nodes are available: the same
        nodes, without a view of each (48 views cost a tenth of a millisecond a unit)."""
        free = [n for n in holders if n.index not in busy] or holders
        return self._preferred_first(
            self.policy.order_available([n.index for n in free if n.available(now)]), spec)

    def _no_live_holder(self, spec: UnitSpec) -> bool:
        """Whether the unit is a client's that no node of the run holding it is alive to
        compute (a silent node is suspect after a few seconds): a client's unit is retried
        only on its holders, and with none left it drops out of the round."""
        if spec.client is None and spec.only_node is None:
            return False
        now = runtime.monotonic()
        return not any(may_compute(n, spec) and n.liveness.state(now) == "alive"
                       for n in self.nodes)

    def _preferred_first(self, order: list[int], spec: UnitSpec) -> list[int]:
        """The unit's preferred node (the one holding its session) first, when the policy
        offers it; otherwise the policy's order, so a unit falls back to any node."""
        if spec.preferred_node is None:
            return order
        preferred = [i for i in order if self._by_index[i].name == spec.preferred_node]
        return preferred + [i for i in order if i not in preferred]

    def _candidates(self, state: WorkQueue, unit: Unit, order: list[int]) -> Iterator[int]:
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
        if not self.nodes:  # every node was left out: the round is failing, saying why
            return WAIT_STEP_SECONDS
        soonest = min(n.benched_until() for n in self.nodes)
        return min(max(soonest - now, 0.0), WAIT_STEP_SECONDS * 4)

    def _attempt(self, state: WorkQueue, unit: Unit, node: NodeHandle,
                 build_task: TaskBuilder) -> str:
        attempt = state.start_attempt(unit, node, lambda number: self.log.started(
            state.ledger_round(unit), unit.spec.unit_id, number, node))
        if attempt is None:
            return "completed"  # settled by another attempt just now: nothing to do
        log.debug("round %d: unit %s attempt %d to %s", state.round_index, unit.spec.unit_id,
                  attempt, node.name)
        began = runtime.monotonic()
        try:
            result = node.train(build_task(unit.spec, attempt))
        except NodeIncompatible as exc:
            self._failed(state, unit, attempt, node, began, bench=False, reason=str(exc))
            raise FatalNodeError(f"{node.name}: {exc}") from exc
        except NodeUnfit as exc:  # not the unit's failure: it goes to another node
            self._unreachable(state, unit, attempt, node, began, str(exc))
            self._leave_out(state, node, str(exc))
            return "rejected"
        except (NodeRefused, AnswerTooLarge) as exc:
            self._failed(state, unit, attempt, node, began, bench=False, reason=str(exc))
            return "failed"
        except AttemptAborted as exc:  # reclaimed: past its deadline, or its node is dead
            self._failed(state, unit, attempt, node, began, bench=True, reason=str(exc),
                         end=AttemptEnd.ABORTED)
            return "failed"
        except NodeUnavailable as exc:
            # The unit never reached the node: the node's failure, not the unit's, so
            # it does not count towards discarding the unit (a machine hosting many
            # nodes dying at once would otherwise use up a unit's failures at once).
            self._unreachable(state, unit, attempt, node, began, str(exc))
            return "rejected"
        except NodeError as exc:  # timed out, reset, a remote error, an undecodable result
            self._failed(state, unit, attempt, node, began, bench=True, reason=str(exc))
            return "failed"
        self._last_contact = runtime.monotonic()
        update: Weights = {}
        if result.status == TaskStatus.COMPLETED:
            try:
                update = decoded(self._filters, result.update)
                run_filters(self._filters,
                            Candidate(unit.spec, node.name, update, result.num_samples),
                            RoundView(self.stragglers.deadline(),
                                      lambda: state.over or self.cancelled.is_set(),
                                      self._vindicate))
            except ValueError as exc:  # a wrong answer: a failure, and benched
                node.refuse(str(exc))  # its summary says why (a relay's, to the coordinator)
                self._failed(state, unit, attempt, node, began, bench=True,
                             reason=f"invalid result: {exc}")
                return "failed"
        return self._answered(state, unit, attempt, node, result, update,
                              runtime.monotonic() - began)

    def _answered(self, state: WorkQueue, unit: Unit, attempt: int, node: NodeHandle,
                  result: TaskResult, update: Weights, seconds: float) -> str:
        self.log.answered(node, result, seconds)
        state.end_attempt(unit, attempt)
        log.debug("round %d: unit %s attempt %d on %s: %s after %.3fs (delay %.2fs)",
                  state.round_index, unit.spec.unit_id, attempt, node.name, result.status.value,
                  seconds, result.delay_seconds)
        ended = functools.partial(self._ended, state, unit, attempt, node)
        if result.status == TaskStatus.REJECTED:
            ended(AttemptEnd.REJECTED, "rejected")
            return "rejected"
        if result.status != TaskStatus.COMPLETED:
            # Cancelled: by us (another attempt won, the round ended), or by the node
            # itself, unit unsettled (one shutting down answers its units in a load delay
            # so; a cancel of an earlier round's attempt of the same unit id)
            ended(AttemptEnd.CANCELLED, result.message, unit_settled=state.is_over(unit))
            return "cancelled"
        if result.delay_seconds == 0:
            self.stragglers.note_unit_time(result.compute_seconds)
        refused: list[str] = []  # a stream's verdict on a result computed from old weights

        def too_stale(reason: str) -> None:
            refused.append(reason)
            ended(AttemptEnd.STALE, reason)

        if state.complete(unit, update, result, node.name,
                          on_kept=lambda: ended(AttemptEnd.COMPLETED), on_stale=too_stale):
            self._cancel_others(unit, node)
            if state.keep_result is not None:
                state.keep_result(state.kept(unit, attempt, node.name, result))
        elif refused:
            log.info("unit %s from %s: %s; issued again", unit.spec.unit_id, node.name,
                     refused[0])
        elif state.over:  # the round ended without it: a stale result, dropped
            ended(AttemptEnd.STALE, f"arrived after round {state.round_index} ended")
        else:
            ended(AttemptEnd.LOST, "another attempt finished first")
        return "completed"

    def _failed(self, state: WorkQueue, unit: Unit, attempt: int, node: NodeHandle,
                began: float, bench: bool, reason: str,
                end: AttemptEnd = AttemptEnd.FAILED) -> None:
        log.warning("unit %s on %s failed: %s", unit.spec.unit_id, node.name, reason)
        self.log.failed_call(node, runtime.monotonic() - began, bench, reason)
        state.end_attempt(unit, attempt)
        with state.recording():  # the unit's ledger round must not move in between
            unit.failed_on.add(node.index)
            discarded = state.record_failure(unit, f"{node.name}: {reason}",
                                             self.settings.max_unit_failures)
            self._ended(state, unit, attempt, node,
                        AttemptEnd.DISCARDED if discarded else end, reason)
        if discarded:
            log.error("unit %s discarded after %d failures", unit.spec.unit_id, unit.failures)

    def _vindicate(self, name: str) -> None:
        """A node refused for a result that another node computed alike: off the bench."""
        for node in self.nodes:
            if node.name == name:
                node.vindicate()

    def _unreachable(self, state: WorkQueue, unit: Unit, attempt: int, node: NodeHandle,
                     began: float, reason: str) -> None:
        log.warning("unit %s: node %s unreachable: %s", unit.spec.unit_id, node.name, reason)
        self.log.failed_call(node, runtime.monotonic() - began, True, reason)
        state.end_attempt(unit, attempt)
        self._ended(state, unit, attempt, node, AttemptEnd.UNREACHABLE,
                    f"node unreachable: {reason}")

    def _leave_out(self, state: WorkQueue, node: NodeHandle, reason: str) -> None:
        """Do without a node that cannot serve the run; fail the round when none is left.
        Under a lock: a second worker refused by the same node must not find the nodes gone
        before the first has listed it among those left out (the round's reason)."""
        with self._leaving:
            if node.leave_out(reason):
                log.warning("node %s is left out of run %s: %s", node.name, self.run_id,
                            reason)
                self.left_out.append(node)
                self.on_left_out(node)
            self.set_nodes([n for n in self.nodes if n.left_out is None])
            if not self.nodes:
                state.fail(RoundFailed(no_node_can_serve(self.left_out),
                                       [n.name for n in self.left_out]))

    def _ended(self, state: WorkQueue, unit: Unit, attempt: int, node: NodeHandle,
               end: AttemptEnd, reason: str | None = None, unit_settled: bool = False) -> None:
        """Record an attempt's end in the round the ledger holds its unit in now."""
        with state.recording():
            self.log.ended(state.ledger_round(unit), unit.spec.unit_id, attempt, node, end,
                           reason, unit_settled=unit_settled)

    # Cancels are queued, never sent from here: a frozen node would hold a worker or the
    # round's own thread for a whole control timeout per cancel. They go in the order the
    # attempts started (each node once): a set of handles would order them by address,
    # and a simulated run would not replay alike in another process.
    def _cancel_others(self, unit: Unit, winner: NodeHandle) -> None:
        for node in _nodes_holding(unit):
            if node is not winner:
                self.cancels.send(node, self.run_id, unit.spec.unit_id)

    def _cancel_leftovers(self, state: WorkQueue) -> None:
        for unit in state.units:
            for node in _nodes_holding(unit):
                self.cancels.send(node, self.run_id, unit.spec.unit_id)


def _nodes_holding(unit: Unit) -> list[NodeHandle]:
    """The nodes of the unit's attempts out, each once, in the order they started."""
    return list(dict.fromkeys(node for node, _ in unit.started.copy().values()))
