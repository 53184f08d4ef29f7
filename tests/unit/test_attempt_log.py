"""Each end of an attempt is written once: the ledger's status, the run's counter and the
node's counters follow from it together."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.inprocess import LocalNode
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.engine.attempt_log import AttemptEnd, AttemptLog
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.progress import CANCELLED, RunProgress
from thrift_trainer.engine.tasks import TaskResult, TaskStatus

# end -> the status the ledger gives the attempt and its unit (a unit still waiting)
EXPECTED = {
    AttemptEnd.COMPLETED: "completed",
    AttemptEnd.REJECTED: "pending",
    AttemptEnd.CANCELLED: "pending",
    AttemptEnd.FAILED: "failed",
    AttemptEnd.ABORTED: "stale",
    AttemptEnd.DISCARDED: "discarded",
    AttemptEnd.UNREACHABLE: "pending",
}


@dataclass
class Recorded:
    """A run "r1" of one planned unit "u1", its store, counters and node."""

    store: RunStore
    progress: RunProgress
    node: LocalNode
    attempts: AttemptLog


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[Recorded]:
    node = LocalNode(0)
    progress = RunProgress("r1", 1, 1, lambda: [node.summary()])
    with RunStore(tmp_path / "runs.db") as store:
        store.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        ledger = UnitLedger(store, "r1", strict=True)
        ledger.plan_units(1, ["u1"])
        yield Recorded(store, progress, node, AttemptLog(ledger, progress))


@pytest.mark.parametrize("end", list(EXPECTED), ids=lambda e: e.name)
def test_an_end_moves_its_counter_and_the_ledger_together(recorded: Recorded,
                                                         end: AttemptEnd) -> None:
    attempts, node, progress = recorded.attempts, recorded.node, recorded.progress
    attempts.started(1, "u1", 1, node)
    assert progress.snapshot().in_flight == 1 and node.in_flight == 1
    attempts.ended(1, "u1", 1, node, end, "why")
    snapshot = progress.snapshot()
    assert snapshot.in_flight == 0
    assert getattr(snapshot, end.counter) == 1
    moved = {"units_done", "rejected", "failed", "stale", "cancelled"} - {end.counter}
    assert all(getattr(snapshot, name) == 0 for name in moved)
    assert recorded.store.unit_history("r1", 1, "u1")[-1].attempt_status == EXPECTED[end]
    counts = recorded.store.ledger_counts("r1")
    assert {status: n for status, n in counts.items() if n} == {EXPECTED[end]: 1}


def test_a_result_after_the_round_or_the_unit_settled_is_stale_or_lost(
        recorded: Recorded) -> None:
    attempts, node = recorded.attempts, recorded.node
    for attempt in (1, 2, 3):
        attempts.started(1, "u1", attempt, node)
    attempts.ended(1, "u1", 1, node, AttemptEnd.COMPLETED)
    attempts.ended(1, "u1", 2, node, AttemptEnd.LOST, "another attempt finished first")
    attempts.ended(1, "u1", 3, node, AttemptEnd.CANCELLED, "cancelled", unit_settled=True)
    statuses = [e.attempt_status for e in recorded.store.unit_history("r1", 1, "u1")]
    snapshot = recorded.progress.snapshot()
    assert (snapshot.units_done, snapshot.cancelled, snapshot.in_flight) == (1, 2, 0)
    assert statuses[-2:] == ["cancelled", "cancelled"]


def test_answers_and_failed_calls_reach_the_node_counters() -> None:
    node = LocalNode(0)
    attempts = AttemptLog(UnitLedger(None, "r1"), RunProgress("r1", 1, 1, lambda: []))
    for _ in range(2):
        node.started()
    attempts.answered(node, TaskResult(status=TaskStatus.REJECTED, update={}, num_samples=0,
                                       model_version=1), 0.1)
    attempts.failed_call(node, 0.2, bench=False, reason="boom")
    assert (node.stats.rejected, node.stats.failed, node.in_flight) == (1, 1, 0)


def test_attempts_out_when_the_run_ends_are_cancelled_with_it(recorded: Recorded) -> None:
    """A cancelled run's attempts answer after it ended: the counters stay as the run
    left them, with the attempts it left out counted as cancelled, as the store does."""
    attempts, node, progress = recorded.attempts, recorded.node, recorded.progress
    for attempt in (1, 2):
        attempts.started(1, "u1", attempt, node)
    attempts.ledger.run_ended(CANCELLED, "cancelled by the client")
    progress.end(CANCELLED, "cancelled by the client")
    for attempt in (1, 2):
        attempts.ended(1, "u1", attempt, node, AttemptEnd.CANCELLED, "cancelled",
                       unit_settled=True)
    snapshot = progress.snapshot()
    assert (snapshot.in_flight, snapshot.cancelled) == (0, 2)
    statuses = [e.attempt_status for e in recorded.store.unit_history("r1", 1, "u1")]
    assert statuses.count("cancelled") == 2


def test_answers_after_the_run_ended_are_in_neither_node_table(recorded: Recorded) -> None:
    """A straggler answering after the run's final node table was taken would make the
    store's table differ from it; neither counts it, and the node is not left in flight."""
    attempts, node = recorded.attempts, recorded.node
    for attempt in (1, 2, 3):
        attempts.started(1, "u1", attempt, node)
    done = TaskResult(status=TaskStatus.COMPLETED, update={}, num_samples=7, model_version=1)
    attempts.answered(node, done, 0.1)
    attempts.stop_counting()
    attempts.answered(node, TaskResult(status=TaskStatus.CANCELLED, update={}, num_samples=0,
                                       model_version=1), 0.1)
    attempts.failed_call(node, 0.2, bench=False, reason="too late")
    stored = {r.node: r for r in recorded.store.node_stats("r1")}[node.name]
    counted = node.summary()
    assert (counted.accepted, counted.cancelled, counted.failed, counted.samples) == (1, 0, 0, 7)
    assert (stored.accepted, stored.cancelled, stored.failed, stored.samples) == (1, 0, 0, 7)
    assert node.in_flight == 0


def test_a_discarded_unit_is_counted_with_its_last_failure_for_the_client(
        recorded: Recorded) -> None:
    attempts, node = recorded.attempts, recorded.node
    attempts.started(1, "u1", 1, node)
    attempts.ended(1, "u1", 1, node, AttemptEnd.DISCARDED, "ValueError: out of memory")
    snapshot = recorded.progress.snapshot()
    assert (snapshot.discarded, snapshot.discard_reason) == (
        1, f"unit u1 on {node.name}: ValueError: out of memory")
