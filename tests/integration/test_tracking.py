"""`coordinator_node.py --track`: every run's figures in TensorBoard event files and an MLflow
run, read back with TensorBoard's own event reader and MLflow's own client (a local store:
no server, no network)."""

from __future__ import annotations

import json
import signal

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import waiting

TRAIN = ("letters", "3", "2", "20", "0.01", "--quiet")


def metrics_rows(cluster, run_id: str) -> list[dict]:
    text = (cluster.workdir / "runs" / run_id / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_tensorboard_and_mlflow_get_every_round_settings_and_model(cluster):
    board, store = cluster.workdir / "board", cluster.workdir / "mlflow.db"
    cluster.add_node()
    cluster.add_node()
    cluster.start_coordinator(2, "--track", f"tensorboard:{board}",
                              "--track", f"mlflow:sqlite:///{store}")
    for run_id in ("first", "second"):
        done = cluster.client(*TRAIN, "--run-id", run_id)
        assert done.returncode == 0, done.stderr + cluster.logs()
    rows = metrics_rows(cluster, "first")
    errors = [row["validation_error"] for row in rows]

    events = EventAccumulator(str(board / "first"))
    events.Reload()
    scalars = events.Scalars("validation_error")
    assert [s.step for s in scalars] == [1, 2, 3]
    assert [s.value for s in scalars] == pytest.approx(errors, rel=1e-6)  # kept as float32
    assert "train_loss" in events.Tags()["scalars"]
    assert "phase_seconds/units" in events.Tags()["scalars"]

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("thrift-trainer")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["first", "second"]  # one each
    (first,) = [run for run in runs if run.info.run_name == "first"]
    assert first.info.status == "FINISHED"
    history = client.get_metric_history(first.info.run_id, "validation_error")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
        list(zip([1, 2, 3], errors, strict=True))
    assert first.data.params["config.eta"] == "0.01"
    assert first.data.params["algorithm"] == "delta_avg"
    artifacts = {a.path for a in client.list_artifacts(first.info.run_id)}
    assert {"model.safetensors", "curves.png", "metrics.jsonl"} <= artifacts
    assert "tracking to" not in cluster.coordinator.log()  # no tracker stopped on an error


def test_a_cancelled_run_ends_its_mlflow_run_killed(cluster):
    store = cluster.workdir / "mlflow.db"
    cluster.add_node(1.0, "--load-delay", "30")  # every unit waits 30 s: the run is slow
    cluster.start_coordinator(1, "--no-speculation", "--track", f"mlflow:sqlite:///{store}")
    client = cluster.start_client(*TRAIN, "--run-id", "slow")
    try:
        cluster.nodes[0].wait_for(r"unit \S+ round \d+ accepted", timeout=60)
        client.send_signal(signal.SIGINT)  # the client cancels its run
        client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
    tracked = MlflowClient(tracking_uri=f"sqlite:///{store}")

    def status() -> str:
        experiment = tracked.get_experiment_by_name("thrift-trainer")
        runs = tracked.search_runs([experiment.experiment_id])
        return runs[0].info.status if runs else ""

    assert waiting.wait_until(lambda: status() == "KILLED", 30), status()

