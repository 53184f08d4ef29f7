"""A run's live progress: what status shows while it runs and after it ended."""

from __future__ import annotations

from thrift_trainer.engine.progress import COMPLETED, RunProgress
from thrift_trainer.engine.records import NodeSummary


def summary(state: str) -> NodeSummary:
    return NodeSummary(node="localhost:9091", accepted=3, rejected=1, delayed=0, failed=0,
                       cancelled=0, busy_seconds=1.0, compute_seconds=0.5, delay_seconds=0.0,
                       state=state, silent_seconds=0.0, pull=False)


def test_an_ended_run_shows_its_nodes_as_they_were_when_it_ended() -> None:
    live = {"state": "alive"}
    progress = RunProgress("r1", 2, 1, lambda: [summary(live["state"])])
    live["state"] = "suspect"
    assert progress.snapshot().nodes[0].state == "suspect"  # live while running
    progress.end(COMPLETED)
    live["state"] = "dead"  # heartbeats stopped with the run: the live view drifts
    snapshot = progress.snapshot()
    assert snapshot.state == COMPLETED
    assert [n.state for n in snapshot.nodes] == ["suspect"]
