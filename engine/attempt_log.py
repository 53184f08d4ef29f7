"""The one place where the end of a unit's attempt is recorded.

An attempt's end is seen by three readers: the run store's ledger (the source of truth for
unit and attempt status: what a resume, `client.py status` after a restart and the soak
check read), the run's live counters (`RunProgress`: the status call and the final
summary) and the node's counters (`NodeCounts`: the node tables). The engine reports each
event once, here, as an `AttemptEnd`; the ledger status and the counter it moves both
follow from it, so the three cannot drift apart. Node answers count until the run has
ended (`stop_counting`): a straggler's answer after that is in neither the run's final
node table nor the store's, which then agree.
"""

from __future__ import annotations

from enum import Enum

from thrift_trainer.engine import runtime
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.tasks import TaskResult


class AttemptEnd(Enum):
    """How an attempt ended: (the run counter it adds to, the ledger status of the attempt,
    or None where the unit decides: "pending" while it may run again, else "cancelled")."""

    COMPLETED = ("units_done", "completed")  # its result is the unit's
    LOST = ("cancelled", "cancelled")  # a result, but another attempt's came first
    STALE = ("stale", "stale")  # a result after its round ended
    REJECTED = ("rejected", "pending")  # the node refused it (load); the unit waits
    CANCELLED = ("cancelled", None)  # the node stopped it
    FAILED = ("failed", "failed")  # an error, a refused result, a timeout
    ABORTED = ("failed", "stale")  # reclaimed: past its deadline, or its node died
    DISCARDED = ("failed", "discarded")  # a failure that used up the unit's failures
    UNREACHABLE = ("failed", "pending")  # never reached the node; not the unit's failure

    def __init__(self, counter: str, ledger_status: str | None) -> None:
        self.counter = counter
        self.ledger_status = ledger_status


class AttemptLog:
    """Writes each attempt event to the ledger, the run's counters and the node's."""

    def __init__(self, ledger: UnitLedger, progress: RunProgress) -> None:
        self.ledger = ledger
        self.progress = progress
        self._counting = True
        self._count_lock = runtime.Lock()  # a node's counters and the store's move together

    def started(self, round_index: int, unit_id: str, attempt: int, node: NodeHandle) -> None:
        """An attempt is out on ``node``."""
        self.ledger.started(round_index, unit_id, attempt, node.name)
        node.started()
        self.progress.add(in_flight=1)

    def answered(self, node: NodeHandle, result: TaskResult, seconds: float) -> None:
        """``node`` answered (any status): its counters and the ledger's node table."""
        with self._count_lock:
            node.finished(result, seconds, counted=self._counting)
            if self._counting:
                self.ledger.node_answer(node.name, result.status.value,
                                        result.delay_seconds > 0, result.num_samples)

    def failed_call(self, node: NodeHandle, seconds: float, bench: bool, reason: str) -> None:
        """A call to ``node`` failed (no answer, or one refused as wrong)."""
        with self._count_lock:
            node.failed(seconds, bench=bench, counted=self._counting)
            if self._counting:
                self.ledger.node_failure(node.name, reason)

    def stop_counting(self) -> None:
        """The run has ended: answers from now on are not counted (see the module's
        docstring); the node table read after this is final."""
        with self._count_lock:
            self._counting = False

    def ended(self, round_index: int, unit_id: str, attempt: int, node: NodeHandle,
              end: AttemptEnd, reason: str | None = None, unit_settled: bool = False) -> None:
        """The attempt is over: the ledger's attempt status and the run's counter.
        ``unit_settled``: the unit is done or its round over (a cancelled attempt of a
        unit that still waits leaves it pending)."""
        status = end.ledger_status or ("cancelled" if unit_settled else "pending")
        self.ledger.finished(round_index, unit_id, attempt, node.name, status, reason)
        self.progress.add(**{end.counter: 1, "in_flight": -1})
        if end is AttemptEnd.DISCARDED:  # said in the client's progress and summary
            self.progress.unit_discarded(f"unit {unit_id} on {node.name}: {reason}")
