"""A node with local workers (`--workers W`): real worker processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from devtools import local_cluster as procs
from tests.waiting import wait_until
from thrift_trainer.compute_node import cli
from thrift_trainer.compute_node.handler import run_unit
from thrift_trainer.compute_node.local_workers import LocalWorkers, WorkerLost
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.unit_parts import weighted_mean
from thrift_trainer.training.units import UnitJob, UnitOutput, UnitSpec

DATA = procs.REPO / "data"
LETTERS = ["--config", str(procs.REPO / "configs" / "letters_sync_sgd.yaml"),
           "--set", "sync_sgd.hidden=[16]"]
PIDS = re.compile(r"2 workers \(gloo, pids (\d+), (\d+)\)")


@pytest.fixture(scope="module")
def workers():
    runner = LocalWorkers(2, "cpu", 1, inner=run_unit)
    runner.start()
    try:
        yield runner
    finally:
        runner.close()


def _job(algorithm, config: dict, round_index: int = 1, unit: int = 1) -> UnitJob:
    weights = algorithm.initial_weights()
    return UnitJob("run", round_index, algorithm.plan_round(round_index)[unit],
                   algorithm.model, config, weights)


def _relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


@pytest.mark.parametrize(("model", "dataset", "config"), [
    ("dcgan28-tiny", "mnist", {"batchnorm": False, "images_per_work_unit": 96,
                               "batch_size": 32}),
    ("mlp", "letters", {"hidden": [16], "images_per_work_unit": 100, "batch_size": 32}),
], ids=["dcgan28-tiny-no-bn", "letters-mlp"])
def test_two_workers_compute_the_gradient_one_computes(workers, model, dataset, config):
    algorithm = SyncSGD(model, config, DATA / dataset)
    one_job, two_job = _job(algorithm, config), _job(algorithm, config)
    one = run_unit(SyncSGD, one_job, DATA / dataset)
    two = workers(SyncSGD, two_job, DATA / dataset)
    assert two.update.keys() == one.update.keys()
    for name, value in one.update.items():
        assert (two.update[name].dtype, two.update[name].shape) == (value.dtype, value.shape)
        assert _relative_error(value, two.update[name]) <= 1e-5, name
    assert two.num_samples == one.num_samples
    assert two.loss == pytest.approx(one.loss, rel=1e-5)
    assert two.error == pytest.approx(one.error, rel=1e-5)
    assert two_job.control.batches == one_job.control.batches  # both workers' batches


def test_with_batchnorm_the_shares_hold_whole_micro_batches(workers):
    """Gradients as one worker's (each micro-batch's statistics are the same); the
    running statistics are the shares' average, in the tensors' shapes and dtypes."""
    config = {"images_per_work_unit": 96, "batch_size": 32}
    algorithm = SyncSGD("dcgan28-tiny", config, DATA / "mnist")
    one = run_unit(SyncSGD, _job(algorithm, config), DATA / "mnist")
    two = workers(SyncSGD, _job(algorithm, config), DATA / "mnist")
    algorithm.check_update(two.update, algorithm.initial_weights())
    # As one vector: the gradients of biases before BN are zero up to rounding noise.
    grads = [name for name in one.update if name.startswith("grad.")]
    assert _relative_error(np.concatenate([one.update[n].ravel() for n in grads]),
                           np.concatenate([two.update[n].ravel() for n in grads])) <= 1e-5


def test_local_training_averages_the_shares_deltas(workers):
    config = {"epochs": 2, "hidden": [8]}
    algorithm = DeltaAveraging("mlp", config, DATA / "letters")
    shares = [DeltaAveraging.run_unit_part(_job(algorithm, config), DATA / "letters", r, 2)
              for r in range(2)]
    expected = weighted_mean(shares)
    two = workers(DeltaAveraging, _job(algorithm, config), DATA / "letters")
    assert two.num_samples == expected.num_samples
    for name, value in expected.update.items():
        assert _relative_error(value, two.update[name]) <= 1e-6, name


def test_fl_gan_averages_the_states_of_shares_of_its_slot(workers):
    config = {"workers": 8, "batch_size": 64}  # a slot of 1,000 images: 15 batches
    algorithm = FLGan("dcgan28-tiny", config, DATA / "mnist")
    weights = algorithm.initial_weights()
    job = UnitJob("run", 1, algorithm.plan_round(1)[0], "dcgan28-tiny", config, weights)
    two = workers(FLGan, job, DATA / "mnist")
    algorithm.check_update(two.update, weights)  # every tensor, shape and dtype; finite
    assert two.num_samples == algorithm.unit_samples(job.unit) == 1000  # as one worker's
    assert job.control.batches == 8 + 7  # shares of 512 and 488 images, whole batches of 64


def test_a_cancelled_unit_stops_every_worker_and_the_group_goes_on(workers):
    config = {"hidden": [16]}
    algorithm = SyncSGD("mlp", config, DATA / "letters")
    job = _job(algorithm, config)
    job.control.cancel()
    with pytest.raises(UnitCancelled):
        workers(SyncSGD, job, DATA / "letters")
    assert workers(SyncSGD, _job(algorithm, config), DATA / "letters").num_samples == 320


def test_a_unit_cancelled_while_it_computes_stops_at_the_next_batch(workers):
    """Cancelled mid-unit, each worker ends the batch it is in and starts no other (the
    unit would take 20 batches a worker); the group then computes the next unit."""
    config = {"epochs": 20, "hidden": [2048, 2048]}  # full batch: an epoch is one slow batch
    algorithm = DeltaAveraging("mlp", config, DATA / "letters")
    job = _job(algorithm, config)
    outcome: list[str] = []

    def compute() -> None:
        try:
            workers(DeltaAveraging, job, DATA / "letters")
            outcome.append("finished")
        except UnitCancelled:
            outcome.append("cancelled")

    thread = threading.Thread(target=compute, daemon=True)
    thread.start()
    assert wait_until(lambda: job.control.batches >= 2, 60.0)  # both workers are computing
    started = job.control.batches
    job.control.cancel()
    thread.join(60.0)
    assert outcome == ["cancelled"]
    assert job.control.batches <= started + 2  # at most one batch more, by a worker that
    # began it as the cancel was passed on
    quick = {"epochs": 1, "hidden": [8]}
    next_unit = _job(DeltaAveraging("mlp", quick, DATA / "letters"), quick)
    assert workers(DeltaAveraging, next_unit, DATA / "letters").num_samples == 1500


def test_an_algorithm_that_does_not_split_runs_in_the_node(workers):
    class Whole:
        splits_units = False

        @classmethod
        def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
            return UnitOutput({}, num_samples=7, loss=0.0, error=0.0)

    job = UnitJob("run", 1, UnitSpec("u1", "train_letters1.txt"), "mlp", {}, {})
    assert workers(Whole, job, DATA).num_samples == 7


def test_a_share_from_a_relay_runs_in_the_node(workers):
    """A relay's local rounds send a node one share of a unit: the node computes it
    itself, the share its workers would otherwise split."""
    config = {"hidden": [16], "epochs": 1}
    algorithm = DeltaAveraging("mlp", config, DATA / "letters")
    job = _job(algorithm, config)
    whole = workers(DeltaAveraging, job, DATA / "letters").num_samples
    half = workers(DeltaAveraging, replace(job, share=(1, 2)), DATA / "letters")
    assert half.num_samples == whole // 2


class _DeadGroup:
    def kill(self) -> None:
        pass


def test_the_node_gives_up_after_its_restarts_with_one_line():
    said = []
    runner = LocalWorkers(2, "cpu", 1, inner=run_unit, on_fatal=said.append, max_restarts=0)
    runner._lost(_DeadGroup(), "local worker 1 (pid 9) was killed by SIGKILL")
    assert said == ["local workers failed 1 times in a row, last: local worker 1 (pid 9) "
                    "was killed by SIGKILL"]
    with pytest.raises(WorkerLost, match="failed 1 times"):
        runner._ready_group(UnitControl())


def test_more_workers_than_cores_are_refused(capsys):
    too_many = (os.cpu_count() or 1) + 1
    assert cli.main(["0", "0", "--workers", str(too_many)]) == 2
    err = capsys.readouterr().err
    assert f"--workers {too_many}" in err and "CPU core" in err


def test_workers_and_relay_are_refused_together(capsys, tmp_path):
    nodes = tmp_path / "group.txt"
    nodes.write_text("127.0.0.1,9\n")
    assert cli.main(["0", "0", "--workers", "2", "--relay", str(nodes)]) == 2
    assert "--workers with --relay" in capsys.readouterr().err


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _worker_pids(node: procs.Proc) -> list[int]:
    return [int(pid) for pid in node.wait_for(PIDS.pattern).groups()]


def test_a_run_through_a_node_with_two_workers_then_a_killed_worker_restarts_its_group(
        cluster):
    """A whole run with no failure first; then, in a second run through the same node, a
    worker killed mid-run fails its unit and the node starts a new group."""
    node = cluster.add_node(0.0, "--workers", "2")
    first = _worker_pids(node)
    cluster.start_coordinator(2)
    result = cluster.train_json(*LETTERS, "--set", "run.rounds=3", "--run-id", "whole")
    assert result["rounds"] == 3 and result["nodes"][0]["accepted"] >= 9
    assert result["nodes"][0]["failed"] == 0
    assert all(_running(pid) for pid in first)

    done_before = node.log().count(" round 3 done")  # the whole run's
    client = cluster.start_client(*LETTERS, "--set", "run.rounds=15", "--json", "--quiet",
                                  "--run-id", "killed-worker")
    try:
        assert wait_until(lambda: node.log().count(" round 3 done") > done_before, 60,
                          alive=node.alive, interval=0.1), node.log()
        os.kill(first[1], signal.SIGKILL)
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    assert f"local worker 1 (pid {first[1]}) was killed by SIGKILL" in node.log()
    # Each group's pids appear in its "ready" line (the first one's in "listening" too).
    restarted = list(dict.fromkeys(tuple(int(p) for p in m.groups())
                                   for m in PIDS.finditer(node.log())))
    assert len(restarted) == 2 and not set(restarted[1]) & set(first)
    assert not any(_running(pid) for pid in first)
    result = json.loads(out)
    assert result["rounds"] == 15 and result["nodes"][0]["failed"] >= 1
    assert result["nodes"][0]["role"] == "2 local workers"  # its summary row says so
    cluster.stop()  # SIGTERM: the node stops its workers
    assert wait_until(lambda: not any(_running(pid) for pid in restarted[1]), 15)


def test_workers_end_with_their_node_even_when_it_is_killed(cluster):
    node = cluster.add_node(0.0, "--workers", "2")
    pids = _worker_pids(node)
    node.kill()  # SIGKILL: the node cannot stop them itself
    assert wait_until(lambda: not any(_running(pid) for pid in pids), 15)


def test_a_clients_unit_reports_its_loss_before_and_an_evaluation_is_computed_whole(workers):
    """Two workers: the loss before training is the shares' sample-weighted one (that of
    one worker), and an evaluation unit is scored by the node, not split and trained."""
    from thrift_trainer.training.run_config import load_run_config
    from thrift_trainer.training.units import EVALUATE

    spec = load_run_config(None, [
        "run.model=mlp_classifier", "run.dataset=letters", "data.format=letters",
        "run.algorithm=delta_avg", "delta_avg.epochs=1", "clients.count=4",
        "clients.validation_fraction=0.2", "clients.eval_every=1"]).to_spec()
    algorithm = DeltaAveraging("mlp_classifier", spec.algorithm_config(), DATA / "letters",
                               "letters")
    config = algorithm.config
    client = algorithm.plan_round(1)[1]
    weights = algorithm.initial_weights()

    def job(unit: UnitSpec) -> UnitJob:
        return UnitJob("run", 1, unit, "mlp_classifier", config, weights, dataset="letters")

    one = run_unit(DeltaAveraging, job(client), DATA / "letters")
    two = workers(DeltaAveraging, job(client), DATA / "letters")
    assert two.num_samples == one.num_samples
    assert two.loss_before == pytest.approx(one.loss_before, rel=1e-6)
    scoring = replace(client, unit_id="eval-" + client.client, kind=EVALUATE)
    alone = run_unit(DeltaAveraging, job(scoring), DATA / "letters")
    scored = workers(DeltaAveraging, job(scoring), DATA / "letters")
    assert scored.update == {} and scored.num_samples == alone.num_samples > 0
    assert (scored.loss, scored.error) == (alone.loss, alone.error)
