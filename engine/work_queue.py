"""The work queue: units, their attempts, backups and failure counts, under one lock.

The round engine's workers take units from here (`next_unit`), start and end attempts
and report what happened; the queue decides what is queued, what is a backup candidate,
and when the work is over. What a kept result does, where units come from once the
queue runs dry and when the work is over is the SETTLEMENT, a subclass's few hooks:
a round's barrier (engine/round_state.py: results wait for the round's quorum) or an
asynchronous run's stream buffer (engine/stream_state.py: results fill a buffer, each
full one a version the training loop makes, units come in passes over the data). The
engine drives both through this class alone. How late units are noticed and issued
again is engine/stragglers.py.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.tasks import TaskResult
from thrift_trainer.training.units import UnitSpec, Weights

log = logging.getLogger("coordinator.engine")

WAIT_STEP_SECONDS = 0.05  # the longest a worker sleeps before re-checking its round


class RoundFailed(Exception):
    """The round (or an asynchronous run's stream) cannot finish: no node reachable, or
    every unit failed."""

    def __init__(self, message: str, nodes_tried: list[str]) -> None:
        super().__init__(message)
        self.nodes_tried = nodes_tried


@dataclass(frozen=True)
class Kept:
    """A result a round or stream kept, as a store that keeps results is told of it."""

    round: int  # the run store's round of its unit
    unit: UnitSpec
    attempt: int
    node: str
    result: TaskResult
    sequence: int | None = None  # a stream's: its place among the results of its round
    staleness: int | None = None  # a stream's: versions behind the newest when kept


ResultSink = Callable[[Kept], None]


@dataclass
class Unit:
    index: int
    spec: UnitSpec
    attempts: int = 0
    failures: int = 0
    reserved: int = 0  # workers holding the unit (primary and backup)
    started: dict[int, tuple[NodeHandle, float]] = field(default_factory=dict)
    done: bool = False
    discarded: bool = False
    # No live node holds the unit's client: it drops out of the round, neither failed nor
    # lost (training/clients/).
    dropped: bool = False
    last_error: str = ""
    # Nodes an attempt of the unit failed on: a retry goes to another node while one can
    # take it, so a unit is not spent on the one node that cannot compute it.
    failed_on: set[int] = field(default_factory=set)

    @property
    def settled(self) -> bool:
        return self.done or self.discarded or self.dropped


class WorkQueue:
    """What the engine's workers share about units and their attempts, under one condition
    variable: which units are queued, which are out where, which are settled, whether the
    work is over. A settlement (module docstring) adds what a result does."""

    round_index: int  # the round in progress
    fills_evenly = False  # True: a unit goes to a node with the fewest units out
    # True: a worker with nothing to do leaves at once instead of waiting, and the engine
    # starts workers where units wait or backups are due (`workers_wanted`). Waiting
    # workers cost a wake each time anything changes, and a round over N nodes had 2N + 2.
    leaves_when_idle = False

    def __init__(self, units: list[Unit], max_attempts: int,
                 lock: Any = None) -> None:
        self.units = units
        self.max_attempts = max_attempts  # live attempts of one unit at once
        self.fatal: Exception | None = None
        self.last_error = ""
        self.keep_result: ResultSink | None = None  # told of each result kept
        self._cond = runtime.Condition(lock)
        self._over = False
        self._queue: deque[Unit] = deque()  # units waiting for a worker
        # When each live attempt started, oldest first: (id(unit), attempt) -> time. Idle
        # workers look for slow units each time they wake; this tells them in one step
        # when none can be (the oldest attempt out is not over the threshold).
        self._live_starts: dict[tuple[int, int], float] = {}
        # A unit is left held by nobody only when a worker lets go of it or an attempt of
        # it ends: the look for such units is made after one of those, not at every wake.
        self._orphans_possible = True
        self.workers = 0  # live workers the engine counts (leaves_when_idle) ...
        self.backup_workers = 0  # ... of which backup-only ones
        self._held = 0  # units held by workers (each worker holds one at most)

    def _requeue_orphans(self) -> None:
        """Put back any unsettled unit that nobody holds, so no path can lose a unit. The
        engine's paths queue such a unit again themselves (a failure, a refusal by every
        node, an attempt its node cancelled): the warning means one did not, a defect to
        look into. It once fired when a failed attempt's unit, queued again while its
        worker still held it, was taken by a second worker that every node refused: that
        worker did not queue it again, since the first still held it (round_state's
        `_may_requeue` now looks at attempts out, not at holders)."""
        for unit in self.units:  # the cheapest tests first
            if not (unit.done or unit.reserved or unit.started or unit.settled
                    or unit in self._queue):
                log.warning("unit %s was held by nobody; queued again", unit.spec.unit_id)
                self._queue.append(unit)

    # ------------------------------------------------------------ scheduling
    def next_unit(self, backup_after: float | None, backups_only: bool = False) -> Unit | None:
        """A unit to work on: a queued one while the settlement lets more out (refilled
        by it when the queue is empty), else a backup of a slow one; None when over."""
        with self._cond:
            while not self._over:
                if self._may_issue(backups_only):
                    if not self._queue and self._orphans_possible:
                        self._orphans_possible = False
                        self._requeue_orphans()
                    if not self._queue:
                        self._refill()
                    if self._queue and not backups_only:
                        return self._issue(self._queue.popleft())
                backup = self._take_backup(backup_after)
                if backup is not None:
                    return backup
                if self.leaves_when_idle:
                    break
                self._cond.wait(self._idle_wait(backup_after))
            if self.leaves_when_idle:
                self._left(backups_only)
            return None

    def workers_wanted(self, backup_after: float | None, queue_limit: int,
                       backup_limit: int) -> tuple[int, int]:
        """Workers to start now (``leaves_when_idle``), counted as started: (workers for
        the queued units that no free worker will take, while fewer than ``queue_limit``
        of them are alive; backup-only workers for the backups due beyond those free
        workers, while fewer than ``backup_limit`` of them are)."""
        with self._cond:
            if self._over:
                return 0, 0
            free = self.workers - self._held
            queue_workers = self.workers - self.backup_workers
            queued = max(0, min(len(self._queue) - free, queue_limit - queue_workers))
            spare = max(0, free - len(self._queue))  # free workers left for backups
            backups = max(0, min(self._backups_due(backup_after) - spare,
                                 backup_limit - self.backup_workers))
            self.workers += queued + backups
            self.backup_workers += backups
            return queued, backups

    def worker_left(self, backups_only: bool) -> None:
        """A worker ended on an error (holding no unit)."""
        with self._cond:
            if self.leaves_when_idle:
                self._left(backups_only)

    def _left(self, backups_only: bool) -> None:
        self.workers -= 1
        if backups_only:
            self.backup_workers -= 1

    def _idle_wait(self, backup_after: float | None) -> float:
        """How long an idle worker sleeps before it looks again, unless woken (under the
        lock): a step by default, for a settlement whose units may become ready with time."""
        return WAIT_STEP_SECONDS

    def requeue(self, unit: Unit, wait_seconds: float, wait_first: bool = False) -> None:
        """Queue a unit no node took, where the settlement says it still needs one; then
        wait ``wait_seconds`` (a back-off) unless something changes first. ``wait_first``:
        wait before queueing it, holding it (when none of its nodes can take it yet, no
        other worker should take it meanwhile, only to find the same)."""
        with self._cond:
            if wait_first and wait_seconds > 0:
                self._cond.wait(wait_seconds)
            if self._may_requeue(unit):
                self._queue.append(unit)
            if not wait_first and wait_seconds > 0:
                self._cond.wait(wait_seconds)

    def _may_issue(self, backups_only: bool) -> bool:
        """Whether a queued unit may go out now (under the lock): always, by default."""
        return True

    def _refill(self) -> None:
        """Queue more units when the queue is empty (under the lock): none by default."""

    def _issue(self, unit: Unit) -> Unit:
        """A unit leaving the queue for a worker (under the lock)."""
        unit.reserved += 1
        self._held += 1
        return unit

    def _may_requeue(self, unit: Unit) -> bool:
        """Whether a unit no node took goes back to the queue (under the lock)."""
        raise NotImplementedError

    def _take_backup(self, backup_after: float | None) -> Unit | None:
        backup = self._slow_unit(backup_after)
        if backup is not None:
            backup.reserved += 1
            self._held += 1
        return backup

    def _slow_unit(self, backup_after: float | None) -> Unit | None:
        """The unit whose newest attempt has been out longest, if that is over the threshold.

        Only units whose every holder is waiting on a node qualify, and a unit never
        holds more attempts than there are nodes, so backups cannot pile up.
        """
        slow, slow_since = None, 0.0
        for unit, newest in self._slow_units(backup_after):
            if slow is None or newest < slow_since:
                slow, slow_since = unit, newest  # the first of equals, as min() keeps
        return slow

    def _backups_due(self, backup_after: float | None) -> int:
        return sum(1 for _ in self._slow_units(backup_after))

    def _slow_units(self, backup_after: float | None) -> Iterator[tuple[Unit, float]]:
        """Each unit a backup may start for now, with its newest attempt's start."""
        if backup_after is None or not self._live_starts:
            return
        now = runtime.monotonic()
        if now - next(iter(self._live_starts.values())) <= backup_after:
            return
        # One pass, cheapest tests first: a worker with nothing queued looks (and a
        # round's thread, each time it wakes).
        for unit in self.units:
            started = unit.started
            if (not started or unit.reserved != len(started)
                    or len(started) >= self.max_attempts or unit.settled):
                continue
            newest = max(t for _, t in started.values())
            if now - newest > backup_after:
                yield unit, newest

    def release(self, unit: Unit) -> None:
        with self._cond:
            unit.reserved -= 1
            self._held -= 1
            self._orphans_possible = True
            if self._release_wakes(unit):
                self._cond.notify_all()

    def _release_wakes(self, unit: Unit) -> bool:
        """Whether a worker letting go of ``unit`` may give a waiting one something to do
        (under the lock): by default, always."""
        return True

    def nodes_of(self, unit: Unit) -> set[int]:
        with self._cond:
            return {node.index for node, _ in unit.started.values()}

    @property
    def over(self) -> bool:
        with self._cond:
            return self._over

    def has_live_attempts(self) -> bool:
        with self._cond:
            return any(u.started for u in self._attempt_holders())

    def _attempt_holders(self) -> list[Unit]:
        """The units whose attempts may be out (under the lock): all of a round's."""
        return self.units

    def is_over(self, unit: Unit) -> bool:
        with self._cond:
            return self._over or unit.settled

    # --------------------------------------------------------------- attempts
    def start_attempt(self, unit: Unit, node: NodeHandle,
                      on_started: Callable[[int], None] | None = None) -> int | None:
        """A new attempt's number, or None when the unit settled meanwhile. `on_started`
        (the ledger's record) runs under the lock, so no completion can come between."""
        with self._cond:
            if self._over or unit.settled:
                return None
            unit.attempts += 1
            now = runtime.monotonic()
            unit.started[unit.attempts] = (node, now)
            key = (id(unit), unit.attempts)
            # inserted afresh: a key that a unit gone left behind (ids are reused) must not
            # keep its older place at the front
            self._live_starts.pop(key, None)
            self._live_starts[key] = now
            if on_started is not None:
                on_started(unit.attempts)
            return unit.attempts

    def live_attempts(self) -> list[tuple[Unit, int, NodeHandle, float]]:
        """(unit, attempt, node, started) of every attempt out on a node."""
        with self._cond:
            return [(unit, attempt, node, started) for unit in self._attempt_holders()
                    for attempt, (node, started) in unit.started.items()]

    def end_attempt(self, unit: Unit, attempt: int) -> None:
        with self._cond:
            unit.started.pop(attempt, None)
            self._live_starts.pop((id(unit), attempt), None)
            self._orphans_possible = True

    def record_failure(self, unit: Unit, reason: str, max_failures: int) -> bool:
        """Count a failure; requeue the unit (first in the queue), or discard it past the
        limit (True)."""
        with self._cond:
            unit.failures += 1
            unit.last_error = self.last_error = reason
            if unit.done:  # a leftover attempt of a unit already kept: nothing to redo
                self._cond.notify_all()
                return False
            used_up = unit.failures >= max_failures
            if used_up and not unit.started:
                unit.discarded = True
            # Past the limit with attempts still out, those decide: requeueing it would
            # start another attempt beside them, and a unit failing everywhere would then
            # never be left without one to be discarded.
            elif not used_up and not unit.done and unit not in self._queue:
                self._queue.appendleft(unit)
            self._after_failure(unit)
            self._cond.notify_all()
            return unit.discarded

    def _after_failure(self, unit: Unit) -> None:
        """What a failure changes beyond the unit (under the lock); nothing by default."""

    def drop(self, unit: Unit, reason: str) -> bool:
        """Settle a unit that no live node can compute (its client's holders are away):
        it drops out of the work, neither failed nor lost. False when it settled before."""
        with self._cond:
            if unit.settled or unit.started:  # an attempt out decides
                return False
            unit.dropped, unit.last_error = True, reason
            if unit in self._queue:
                self._queue.remove(unit)
            self._after_failure(unit)
            self._cond.notify_all()
            return True

    def kept(self, unit: Unit, attempt: int, node: str, result: TaskResult) -> Kept:
        """What ``keep_result`` is told of a result ``complete`` kept."""
        raise NotImplementedError

    def complete(self, unit: Unit, update: Weights, result: TaskResult,
                 node: str | None = None, on_kept: Callable[[], None] | None = None,
                 on_stale: Callable[[str], None] | None = None) -> bool:
        """Keep a result (from node ``node``) if the settlement takes it: ``on_kept``
        records it before anything can end; ``on_stale`` says why one was refused as too
        old (its unit is computed again)."""
        raise NotImplementedError

    def units_per_round(self) -> int:
        """Results a round keeps: what update filters size their round's view by."""
        raise NotImplementedError

    def ledger_round(self, unit: Unit) -> int:
        """The run store's round that holds ``unit``: the round in progress by default."""
        return self.round_index

    def recording(self) -> AbstractContextManager[None]:
        """Held while the engine writes a unit's event to the ledger: nothing to hold
        where units never move to another round (see stream_state)."""
        return nullcontext()

    # ------------------------------------------------------------------- end
    def fail(self, exc: Exception) -> None:
        with self._cond:
            self.fatal = exc
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._over = True
            self._cond.notify_all()


