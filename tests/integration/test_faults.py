"""Faults through real processes: a coordinator killed and resumed, nodes that hang or die."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from devtools import local_cluster as procs
from training.model_file import load_model
from wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from wire.rpc import connect

ROUNDS = 6
# Server momentum keeps state between rounds: a resume that lost it would change the bits.
TRAIN = ["letters", str(ROUNDS), "2", "16", "0.01", "--local-optimizer", "sgd",
         "--server-optimizer", "momentum"]


def _model(cluster, run_id: str) -> dict[str, np.ndarray]:
    weights, _ = load_model(cluster.workdir / "runs" / run_id / "model.npz")
    return weights


def _completed_per_round(cluster, run_id: str) -> dict[int, int]:
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        rows = db.execute("SELECT round, COUNT(*) FROM units WHERE run_id = ? AND "
                          "status = 'completed' GROUP BY round", (run_id,)).fetchall()
        states = db.execute("SELECT DISTINCT status FROM units WHERE run_id = ?",
                            (run_id,)).fetchall()
    assert {s for (s,) in states} == {"completed"}
    return dict(rows)


def test_a_killed_coordinator_resumes_and_ends_with_the_same_bits(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    cluster.start_coordinator(2, "--deterministic")
    client = cluster.start_client(*TRAIN, "--run-id", "crashed", "--quiet", "--dead-after", "3")
    try:
        cluster.coordinator.wait_for(r"round 3/6", timeout=60)
        cluster.coordinator.kill()  # SIGKILL: no chance to write anything more
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1 and "--resume crashed" in err

    nodes_file = cluster.workdir / "compute_nodes.txt"
    cluster.coordinator = procs.start_coordinator(cluster.workdir, nodes_file, 2,
                                                  "--deterministic", "--resume", "crashed")
    attached = procs.run_client(["attach", "127.0.0.1", str(cluster.coordinator.port),
                                 "crashed", "--json", "--poll", "0.2"], cluster.workdir)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    assert json.loads(attached.stdout)["state"] == "completed"
    resumed_after = int(cluster.coordinator.wait_for(r"resumes after round (\d+)").group(1))
    assert resumed_after >= 2 and "round 1/6" not in cluster.coordinator.log()
    reference = cluster.train_json(*TRAIN, "--run-id", "reference")  # never interrupted

    expected, resumed = _model(cluster, "reference"), _model(cluster, "crashed")
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert np.array_equal(expected[name], resumed[name]), name  # bit for bit
    assert len(reference["history"]) == ROUNDS
    # Every unit of every round completed exactly once: none lost, none counted twice.
    assert _completed_per_round(cluster, "crashed") == _completed_per_round(cluster, "reference")
    rows = (cluster.workdir / "runs" / "crashed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == list(range(1, ROUNDS + 1))

    listed = procs.run_client(["runs", "127.0.0.1", str(cluster.coordinator.port), "--json"],
                              cluster.workdir)
    assert {r["run_id"]: r["state"] for r in json.loads(listed.stdout)} == {
        "crashed": "completed", "reference": "completed"}


def test_resume_refuses_an_unknown_run(cluster):
    cluster.add_node(0.0)
    nodes_file = procs.write_nodes_file(cluster.workdir / "compute_nodes.txt", cluster.nodes)
    proc = subprocess.run(
        [sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2",
         "--nodes-file", str(nodes_file), "--run-dir", str(cluster.workdir / "runs"),
         "--resume", "nosuchrun"], capture_output=True, text=True, timeout=60,
        env=procs.python_env())
    assert proc.returncode == 1
    assert "cannot resume run nosuchrun" in proc.stderr and "request.json" in proc.stderr


ASSIGNMENT = ["letters", "5", "15", "20", "0.0001", "--compat"]


def _events(cluster, run_id: str, reason_like: str) -> list[tuple]:
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        return db.execute("SELECT round, unit_id, node, attempt_status, reason FROM unit_events "
                          "WHERE run_id = ? AND reason LIKE ?", (run_id, reason_like)).fetchall()


def test_registered_and_pull_nodes_train_beside_listed_ones_and_leave(cluster):
    cluster.add_node(0.0)  # listed in compute_nodes.txt
    coordinator = cluster.start_coordinator(2)
    announced = cluster.add_node(0.0, "--register", f"127.0.0.1:{coordinator.port}",
                                 "--advertise", "127.0.0.1")
    pulled = [procs.start_pull_node(cluster.workdir, f"laptop{i}", coordinator.port)
              for i in (1, 2)]
    cluster.nodes.extend(pulled)  # stopped with the cluster
    for name in ("laptop1", "laptop2"):
        coordinator.wait_for(rf"node pull:{name} registered")
    coordinator.wait_for(rf"node 127.0.0.1:{announced.port} registered")
    result = cluster.train_json(*ASSIGNMENT, "--run-id", "mixed")
    assert round(result["validation_error"], 4) == 0.8054  # same numbers, whoever computes
    by_node = {n["node"]: n for n in result["nodes"]}
    assert len(by_node) == 4 and all(n["accepted"] > 0 for n in by_node.values())
    assert by_node["pull:laptop1"]["pull"] and not by_node[f"127.0.0.1:{announced.port}"]["pull"]
    pulled[0].stop()  # nodes that stop say goodbye
    announced.stop()
    coordinator.wait_for(r"node pull:laptop1 left")
    coordinator.wait_for(rf"node 127.0.0.1:{announced.port} left")


def test_a_pull_node_of_another_protocol_version_is_refused(cluster):
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2)
    with (connect(Coordinator.Client, "127.0.0.1", coordinator.port) as client,
          pytest.raises(ttypes.VersionMismatch) as refused):
        client.register_node(ttypes.RegisterRequest(
            protocol_version=PROTOCOL_VERSION + 1, node_id="old", pull=True))
    assert "does not match" in refused.value.message
    assert "same release" in refused.value.message


def test_a_hanging_node_has_its_units_reclaimed_after_their_deadline(cluster):
    cluster.add_node(0.0)
    hanging = cluster.add_node(0.0, "--hang-after-units", "2")
    cluster.start_coordinator(2, "--deadline-floor", "1", "--no-speculation")
    result = cluster.train_json(*ASSIGNMENT, "--run-id", "hang")
    assert round(result["validation_error"], 4) == 0.8054
    assert hanging.alive()  # it still answers pings: it is not dead, only too slow
    reclaimed = _events(cluster, "hang", "deadline exceeded%")
    assert reclaimed and all(e[2].endswith(f":{hanging.port}") and e[3] == "stale"
                             for e in reclaimed)


def test_a_frozen_node_is_declared_dead_and_its_units_go_elsewhere(cluster):
    cluster.add_node(0.0)
    frozen = cluster.add_node(0.0, "--load-delay", "0.5")
    cluster.start_coordinator(1, "--no-speculation", "--heartbeat", "0.2",
                              "--suspect-after", "0.6", "--dead-after", "1.5")
    client = cluster.start_client(*ASSIGNMENT, "--run-id", "frozen", "--json", "--quiet")
    try:
        frozen.wait_for(r"round 2 accepted", timeout=60)
        os.kill(frozen.popen.pid, signal.SIGSTOP)  # alive to the kernel, silent to everyone
        out, err = client.communicate(timeout=120)
    finally:
        os.kill(frozen.popen.pid, signal.SIGCONT)
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    assert round(json.loads(out)["validation_error"], 4) == 0.8054
    dead = _events(cluster, "frozen", "node % is dead%")
    assert dead and all(e[2].endswith(f":{frozen.port}") for e in dead)
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        heard = dict(db.execute("SELECT node, last_heartbeat FROM nodes WHERE run_id = ?",
                                ("frozen",)))
    healthy = f"127.0.0.1:{cluster.nodes[0].port}"
    assert heard[healthy] - heard[f"127.0.0.1:{frozen.port}"] > 1.5  # silent since frozen


@pytest.mark.parametrize("mode, reason", [
    ("nan", "%NaN or infinite%"), ("shape", "%has shape%"), ("huge", "%median of recent%")])
def test_spoiled_updates_are_refused_with_their_reason_and_redone_elsewhere(cluster, mode,
                                                                            reason):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    # A node that goes bad during the run: the norm check judges against the scale of
    # the updates accepted before (the first updates of a run set that scale).
    spoiler = cluster.add_node(0.0, "--corrupt-updates", mode, "--corrupt-after-units", "8")
    cluster.start_coordinator(2)
    result = cluster.train_json(*ASSIGNMENT, "--run-id", f"spoiled-{mode}")
    assert round(result["validation_error"], 4) == 0.8054  # nothing spoiled got in
    refused = _events(cluster, f"spoiled-{mode}", f"invalid result: {reason}")
    assert refused and all(e[2].endswith(f":{spoiler.port}") for e in refused)
    by_node = {n["node"]: n for n in result["nodes"]}
    assert by_node[f"127.0.0.1:{spoiler.port}"]["failed"] >= 1


UNSTABLE = ["letters", "4", "5", "64", "0.001"]  # updates grow 15-140x in round 2


def test_an_unstable_run_benches_no_honest_node_and_still_refuses_a_huge_update(cluster):
    honest = [cluster.add_node(0.0) for _ in range(3)]
    spoiler = cluster.add_node(0.0, "--corrupt-updates", "huge", "--corrupt-after-units", "5")
    cluster.start_coordinator(2)
    result = cluster.train_json(*UNSTABLE, "--run-id", "unstable", timeout=240)
    by_node = {n["node"]: n for n in result["nodes"]}
    failed = [by_node[f"127.0.0.1:{n.port}"]["failed"] for n in honest]
    assert failed == [0, 0, 0], cluster.logs()
    refused = _events(cluster, "unstable", "invalid result: %norm%")
    assert refused and all(e[2].endswith(f":{spoiler.port}") for e in refused)
    assert cluster.coordinator.log().count("training looks unstable") == 1
