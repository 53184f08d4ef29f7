"""Full runs through real compute-node and coordinator processes on loopback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from devtools.local_cluster import REPO, run_client, write_nodes_file
from thrift_trainer.client.cli import parse_train_args, train_config
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.outputs.model_file import load_model
from thrift_trainer.training.units import UnitJob

ASSIGNMENT = ["letters", "5", "15", "20", "0.0001", "--compat"]
FAST_DELAY = ["--load-delay", "0.2"]


def units_accepted(result: dict) -> int:
    return sum(n["accepted"] for n in result["nodes"])


def test_three_nodes_reproduce_the_assignment_and_save_a_usable_model(cluster):
    for load in (0.2, 0.4, 0.6):
        cluster.add_node(load, *FAST_DELAY)
    cluster.start_coordinator(2)
    result = cluster.train_json(*ASSIGNMENT)
    assert round(result["validation_error"], 4) == 0.8054
    assert [round(h["validation_error"], 4) for h in result["history"]] == [
        0.9574, 0.9277, 0.7954, 0.7720, 0.8054]
    assert units_accepted(result) >= 55  # backups may add accepted duplicates
    evaluated = run_client(["evaluate", result["model_path"], "--json"], cluster.workdir)
    assert evaluated.returncode == 0, evaluated.stderr
    assert '"error": 0.8054' in evaluated.stdout


def test_shards_of_unequal_sizes_are_averaged_by_their_rows(cluster, tmp_path):
    """Shards of 1,500, 500 and 100 rows: the run's model is the one a weighted mean of
    the units' updates makes (computed here), far from an unweighted mean's."""
    root = tmp_path / "data"
    (root / "letters").mkdir(parents=True)
    for index, rows in ((1, 1500), (2, 500), (3, 100)):
        lines = (REPO / "data" / "letters" / f"train_letters{index}.txt").read_text()
        (root / "letters" / f"train_letters{index}.txt").write_text(
            "".join(lines.splitlines(keepends=True)[:rows]))
    shutil.copy(REPO / "data" / "letters" / "validate_letters.txt", root / "letters")
    for _ in range(2):
        cluster.add_node(0.0, "--data-root", str(root))
    cluster.start_coordinator(2, "--deterministic", "--data-root", str(root))
    args = ["letters", "2", "3", "20", "0.01", "--seed", "3"]
    result = cluster.train_json(*args, "--run-id", "unequal")
    assert result["units"]["done"] == 6
    saved, _ = load_model(cluster.workdir / "runs" / "unequal" / "model.npz")

    def replayed(weighted: bool) -> dict[str, np.ndarray]:
        """The run replayed here: each unit's update as a node computes it, combined by a
        plain weighted (or unweighted) mean, and the algorithm's server step."""
        sent = train_config(parse_train_args(["127.0.0.1", "1", *args]))  # as the client
        algorithm = DeltaAveraging("mlp", sent, root / "letters")
        weights = algorithm.initial_weights()
        for round_index in (1, 2):
            outputs = [DeltaAveraging.run_unit(UnitJob("unequal", round_index, unit, "mlp",
                                                       algorithm.config, weights),
                                               root / "letters")
                       for unit in algorithm.plan_round(round_index)]
            assert sorted(o.num_samples for o in outputs) == [100, 500, 1500]
            counts = [o.num_samples if weighted else 1 for o in outputs]
            mean = {name: sum(n * o.update[name].astype(np.float64)
                              for o, n in zip(outputs, counts, strict=True)) / sum(counts)
                    for name in weights}
            weights = algorithm.apply(weights, mean)
        return weights

    weighted, unweighted = replayed(True), replayed(False)
    for name, value in weighted.items():
        np.testing.assert_allclose(saved[name], value, rtol=1e-6, atol=1e-9, err_msg=name)
        assert not np.allclose(saved[name], unweighted[name], rtol=1e-3), name


def test_policy_2_at_load_0_8_rejects_yet_completes_every_unit(cluster):
    for _ in range(4):
        cluster.add_node(0.8, *FAST_DELAY)
    cluster.start_coordinator(2)
    result = cluster.train_json(*ASSIGNMENT)
    assert sum(n["rejected"] for n in result["nodes"]) > 0
    assert units_accepted(result) >= 55
    assert round(result["validation_error"], 4) == 0.8054
    assert_one_record(result, cluster)


def assert_one_record(result: dict, cluster) -> None:
    """The summary's unit counts are the status call's, agree with the run store's ledger
    and with the nodes' own counters."""
    status = run_client(["status", "127.0.0.1", str(cluster.coordinator.port),
                         result["run_id"], "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    units = result["units"]
    assert {key: units[key] for key in ("rejected", "failed", "stale", "cancelled")} == {
        key: shown[key] for key in ("rejected", "failed", "stale", "cancelled")}
    assert (units["done"], units["total"]) == (shown["units_done"], shown["units_total"])
    assert units["ledger"] == shown["ledger"]
    assert units["done"] == units["total"] == units["ledger"]["completed"]
    assert units["rejected"] == sum(n["rejected"] for n in result["nodes"])
    assert units["failed"] == sum(n["failed"] for n in result["nodes"])


def test_random_policy_never_sees_a_rejection(cluster):
    for _ in range(2):
        cluster.add_node(0.5, *FAST_DELAY)
    cluster.start_coordinator(1)
    result = cluster.train_json("letters", "2", "15", "20", "0.0001", "--compat")
    assert sum(n["rejected"] for n in result["nodes"]) == 0
    assert sum(n["delayed"] for n in result["nodes"]) > 0


def test_a_node_killed_mid_run_has_its_units_retried_elsewhere(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    doomed = cluster.add_node(0.0, "--crash-after-units", "4")
    cluster.start_coordinator(2)
    result = cluster.train_json(*ASSIGNMENT)
    assert not doomed.alive()
    assert round(result["validation_error"], 4) == 0.8054
    crashed = next(n for n in result["nodes"] if n["node"].endswith(f":{doomed.port}"))
    assert crashed["failed"] >= 1


def test_all_nodes_dead_fails_with_the_nodes_tried(cluster):
    first, second = cluster.add_node(0.0), cluster.add_node(0.0)
    first.stop()
    second.stop()
    cluster.start_coordinator(2, "--grace", "2")
    done = cluster.client(*ASSIGNMENT, "--quiet")
    assert done.returncode == 1
    assert "training failed" in done.stderr
    assert f"127.0.0.1:{first.port}" in done.stderr and f"127.0.0.1:{second.port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_run_store_accounts_for_every_unit(cluster):
    cluster.add_node(0.5, *FAST_DELAY)
    cluster.add_node(0.5, *FAST_DELAY)
    cluster.start_coordinator(3)
    result = cluster.train_json("letters", "3", "15", "20", "0.0001")
    assert_one_record(result, cluster)
    status = run_client(["status", "127.0.0.1", str(cluster.coordinator.port),
                         result["run_id"], "--json"], cluster.workdir)
    ledger = json.loads(status.stdout)["ledger"]
    assert ledger["completed"] == 33
    assert ledger["pending"] == ledger["in_progress"] == ledger["failed"] == 0
    assert sum(ledger.values()) == 33  # three rounds of eleven units, none lost
    assert json.loads(status.stdout)["unfinished"] == []
    assert (cluster.workdir / "runs" / "runs.db").is_file()


def test_nodes_added_to_the_nodes_file_join_the_running_job(cluster):
    # The assignment's test case 6: start with 2 nodes, add 2 while training.
    for _ in range(2):
        cluster.add_node(1.0, "--load-delay", "0.3")  # policy 1: every unit waits 0.3 s
    cluster.start_coordinator(1, "--no-speculation")
    late = [cluster.add_node(0.0) for _ in range(2)]
    client = cluster.start_client(*ASSIGNMENT, "--json", "--quiet")
    try:
        cluster.coordinator.wait_for(r"round 1/5")
        write_nodes_file(cluster.workdir / "compute_nodes.txt", cluster.nodes)
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err
    result = json.loads(out)
    assert round(result["validation_error"], 4) == 0.8054
    joined = [n for n in result["nodes"] if n["node"].endswith(tuple(f":{p.port}" for p in late))]
    assert len(joined) == 2 and all(n["accepted"] > 0 for n in joined)
    cluster.coordinator.wait_for(r"nodes joined")


def test_a_config_file_runs_sync_sgd_on_the_mlp_and_on_a_tiny_dcgan(cluster):
    cluster.add_node(0.2, *FAST_DELAY)
    cluster.add_node(0.2, *FAST_DELAY)
    cluster.start_coordinator(3)
    configs = REPO / "configs"
    letters = cluster.train_json("--config", str(configs / "letters_sync_sgd.yaml"),
                                 "--set", "run.rounds=15")
    assert letters["rounds"] == 15
    assert letters["history"][-1]["validation_error"] < letters["history"][0]["validation_error"]
    gan = cluster.train_json("--config", str(configs / "dcgan_mnist_tiny.yaml"))
    assert gan["rounds"] == 2
    assert sum(n["accepted"] for n in gan["nodes"]) >= 4  # K = 2 units per iteration
    # IS is at most the classifier's 10 classes; each round scores its own generator
    assert all(1.0 <= h["inception_score"] <= 10.0 for h in gan["history"])
    assert gan["history"][0]["fid_features"] != gan["history"][1]["fid_features"]
    run_dir = Path(gan["coordinator_run_dir"])
    for name in ("samples/round_00001.png", "samples/round_00002.png", "curves.png",
                 "checkpoint.npz", "model.npz", "metrics.jsonl"):
        assert (run_dir / name).is_file(), name
    for saved in (gan["model_path"], str(run_dir / "checkpoint.npz")):
        scored = run_client(["evaluate", saved, "--n", "200", "--json"], cluster.workdir)
        assert scored.returncode == 0, scored.stderr
        assert json.loads(scored.stdout)["fid_features"] == pytest.approx(
            gan["history"][-1]["fid_features"], rel=1e-6)
    with Image.open(run_dir / "samples" / "round_00002.png") as grid:
        assert grid.size == (8 * 30 + 2, 8 * 30 + 2)  # 64 samples of 28x28, 2-pixel gaps
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # where each round's time went, in the order the phases ran
        phases = row["phase_seconds"]
        assert list(phases) == ["plan", "units", "aggregate", "after_round", "evaluate",
                                "score", "ledger", "samples"]
        assert phases["units"] > 0 and phases["score"] > 0 and phases["samples"] > 0
        # "seconds" is taken after the evaluation: the phases before it fit inside it
        assert sum(list(phases.values())[:5]) <= row["seconds"] + 1e-3


def test_progress_to_a_pipe_has_one_line_per_round_when_rounds_outpace_the_polls(cluster):
    """Rounds of a few tens of ms, polled every 2 s: every round still gets its line."""
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    done = cluster.client("letters", "12", "1", "20", "0.0001", "--poll", "2")
    assert done.returncode == 0, done.stderr + cluster.logs()
    heads = [line.split("  ")[0] for line in done.stderr.splitlines()
             if line.startswith("round ")]
    assert heads[-1] == "round 12/12 completed", done.stderr
    # the last round may be said twice: while the run saves its outputs, then at its end
    rounds = [head.removesuffix(" completed") for head in heads]
    assert sorted(set(rounds), key=rounds.index) == [f"round {r}/12" for r in range(1, 13)]
    assert len(rounds) - len(set(rounds)) <= 1, done.stderr


def test_runs_names_each_run_s_algorithm_and_model_live_and_after_a_restart(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    done = cluster.client("letters", "1", "1", "20", "0.0001", "--run-id", "named")
    assert done.returncode == 0, done.stderr + cluster.logs()
    for restarted in (False, True):
        if restarted:  # the run is read from the run store now
            cluster.coordinator.stop()
            cluster.start_coordinator(2)
        runs = run_client(
            ["runs", "127.0.0.1", str(cluster.coordinator.port)], cluster.workdir)
        assert runs.returncode == 0, runs.stderr
        row = next(line.split() for line in runs.stdout.splitlines() if line.startswith("named"))
        assert row[:4] == ["named", "completed", "delta_avg", "mlp"], runs.stdout
