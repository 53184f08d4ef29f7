"""A node's counts are one record type: the engine's counters, the summary built from them
(and its wire form), and the run store's record that a stored run's summary reads."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tests.inprocess import LocalNode
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.coordinator.stored_status import stored_status
from thrift_trainer.engine.nodes.thrift_client import node_summary, summary_from_wire
from thrift_trainer.engine.records import NodeCounts
from thrift_trainer.engine.tasks import TaskResult, TaskStatus


def answer(status: TaskStatus, compute: float = 0.0, delay: float = 0.0) -> TaskResult:
    return TaskResult(status=status, update={}, num_samples=10, model_version=0,
                      compute_seconds=compute, delay_seconds=delay)


def test_a_summary_carries_the_counts_the_engine_kept() -> None:
    node = LocalNode(0)
    for _ in range(2):
        node.started()
    node.finished(answer(TaskStatus.COMPLETED, compute=2.0, delay=1.0), seconds=3.5)
    node.finished(answer(TaskStatus.REJECTED), seconds=0.25)
    node.started()
    node.failed(seconds=1.0, bench=False)
    expected = NodeCounts(accepted=1, rejected=1, delayed=1, failed=1, samples=10,
                          busy_seconds=4.75, compute_seconds=2.0, delay_seconds=1.0)
    assert node.stats == expected
    summary = node.summary()
    assert summary.count_fields() == asdict(expected)
    assert summary_from_wire(node_summary(summary)) == summary  # and the wire keeps them


def test_a_stored_run_shows_the_counts_the_store_kept_and_no_seconds(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        store.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters",
                         rounds=1)
        store.node_answer("r1", "n1:9091", "completed", delayed=True, samples=10)
        store.node_answer("r1", "n1:9091", "rejected", delayed=False)
        store.node_failure("r1", "n1:9091", "timed out")
        store.plan_units("r1", 1, ["u1"])
        store.unit_started("r1", 1, "u1", 1, "n1:9091")
        store.unit_finished("r1", 1, "u1", 1, "n1:9091", "discarded", "timed out")
        record, = store.node_stats("r1")
        status = stored_status(store, store.get_run("r1"), suspect_seconds=5.0,
                               dead_seconds=30.0)
    assert isinstance(record, NodeCounts) and record.samples == 10
    assert record.count_fields() == asdict(NodeCounts(accepted=1, rejected=1, delayed=1,
                                                      failed=1, samples=10))
    summary, = status.nodes
    assert (summary.node, summary.count_fields()) == ("n1:9091", record.count_fields())
    assert (status.rejected, status.failed) == (1, 1)
    assert (status.discarded, status.discard_reason) == (1, "unit u1 on n1:9091: timed out")
