"""A round's settlement of the work queue: the round barrier.

The round's results wait in unit order for the barrier; the round is over once `quorum`
of its units are in or every unit is settled, and `outcome` is what it produced. The
queue, attempts, backups and failure counts are the work queue's (engine/work_queue.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from thrift_trainer.engine.tasks import TaskResult
from thrift_trainer.engine.work_queue import (
    WAIT_STEP_SECONDS,
    Kept,
    ResultSink,
    RoundFailed,
    Unit,
    WorkQueue,
)
from thrift_trainer.training.units import UnitFailure, UnitResult, UnitSpec, Weights

# What a round's callers import from here with the barrier.
__all__ = ["WAIT_STEP_SECONDS", "Kept", "ResultSink", "RoundFailed", "RoundOutcome",
           "RoundState", "Unit"]


@dataclass
class RoundOutcome:
    """What a round produced: its accepted results in unit order, and its failed units."""

    results: list[UnitResult]
    failures: list[UnitFailure]
    train_loss: float
    dropped: list[UnitFailure] = field(default_factory=list)  # no live holder of its client

    @property
    def completed(self) -> int:
        return len(self.results)

    @property
    def discarded(self) -> list[str]:
        return [failure.unit.unit_id for failure in self.failures]

    @property
    def placement(self) -> dict[str, str]:
        """Unit id -> name of the node whose result was used (where its session now lives)."""
        return {r.unit.unit_id: r.node for r in self.results if r.node is not None}



class RoundState(WorkQueue):
    """The work queue of one round, settled by its barrier (module docstring). Its
    workers leave when they find nothing to do: the engine starts others as units
    wait or backups fall due (`workers_wanted`)."""

    leaves_when_idle = True

    def __init__(self, round_index: int, units: list[UnitSpec], quorum: int,
                 max_attempts: int,
                 earlier_attempts: Mapping[str, int] | None = None,
                 taken_up: Mapping[str, UnitResult] | None = None) -> None:
        """``earlier_attempts`` and ``taken_up``: a round reopened by a resume numbers its
        units' attempts on from there, and starts with the results kept before it."""
        earlier = earlier_attempts or {}
        super().__init__([Unit(i, spec, attempts=earlier.get(spec.unit_id, 0))
                          for i, spec in enumerate(units)], max_attempts)
        self.round_index = round_index
        self.quorum = min(quorum, len(units))
        self.results: dict[int, UnitResult] = {}  # unit index -> its accepted result
        for unit in self.units:
            kept = (taken_up or {}).get(unit.spec.unit_id)
            if kept is not None:
                unit.done = True
                self.results[unit.index] = kept
        self.completed = len(self.results)
        self._queue.extend(u for u in self.units if not u.done)
        self._check_over()

    # ------------------------------------------------------------ scheduling
    def _may_requeue(self, unit: Unit) -> bool:
        """Unless it settled, an attempt of it is out (that attempt decides), or it is
        queued already. Another worker holding it without an attempt out does not stop
        it: a failed attempt queues its unit again while its worker still holds it, and
        a second worker that takes it and finds every node refusing must queue it again
        itself, since the first only lets go of it."""
        return not (unit.settled or unit.started) and unit not in self._queue

    def units_per_round(self) -> int:
        return self.quorum

    def _release_wakes(self, unit: Unit) -> bool:
        """A settled unit let go of leaves nothing to do (no backup of it, nothing to
        queue again), and the barrier was told when it settled: the round's thread,
        which starts workers, need not wake for it."""
        return not unit.settled

    # --------------------------------------------------------------- attempts
    def _after_failure(self, unit: Unit) -> None:
        self._check_over()  # a discarded or dropped unit may have been the round's last

    @property
    def all_dropped(self) -> bool:
        """Every unit dropped out (no live node held any of their clients)."""
        with self._cond:
            return bool(self.units) and all(u.dropped for u in self.units)

    def complete(self, unit: Unit, update: Weights, result: TaskResult,
                 node: str | None = None, on_kept: Callable[[], None] | None = None,
                 on_stale: Callable[[str], None] | None = None) -> bool:
        """Keep a result (from node ``node``) if it is the unit's first and the round
        still runs. `on_kept` runs before the round can end (the ledger's "completed",
        which must precede the round's record that cancels what it left unsettled).
        A round's results are never too stale: ``on_stale`` is for streams."""
        with self._cond:
            if unit.settled or self._over:
                return False
            unit.done = True
            self.results[unit.index] = UnitResult(unit.spec, update, result.num_samples,
                                                  result.loss, node, result.loss_before,
                                                  result.error, result.secure_aggregation)
            if on_kept is not None:
                on_kept()
            self.completed += 1
            self._check_over()
            if self._over:  # a kept result gives a waiting worker nothing else to do
                self._cond.notify_all()
        return True

    def kept(self, unit: Unit, attempt: int, node: str, result: TaskResult) -> Kept:
        return Kept(self.round_index, unit.spec, attempt, node, result)

    def _check_over(self) -> None:
        # all() stops at the first unsettled unit: this runs for every completed unit
        if self.completed >= self.quorum or all(u.settled for u in self.units):
            self._over = True

    # ------------------------------------------------------------------- end
    def wait_finished(self, timeout: float) -> bool:
        with self._cond:
            if not self._over and self.fatal is None:
                self._cond.wait(timeout)
            return self._over and self.fatal is None

    def outcome(self) -> RoundOutcome:
        """The accepted results in unit order (so arrival order changes no bit of what an
        algorithm computes from them) and the discarded units with their last error."""
        with self._cond:
            results = [self.results[index] for index in sorted(self.results)]
            failures = [UnitFailure(u.spec, u.last_error) for u in self.units if u.discarded]
            dropped = [UnitFailure(u.spec, u.last_error) for u in self.units if u.dropped]
        samples = sum(r.num_samples for r in results)
        loss = (sum(r.loss * r.num_samples for r in results) / samples if samples
                else float("nan"))
        return RoundOutcome(results, failures, loss, dropped)
