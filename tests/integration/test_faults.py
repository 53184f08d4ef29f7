"""Faults through real processes: a coordinator killed and resumed, nodes that hang or die."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing

import numpy as np
import pytest

from devtools import local_cluster as procs
from thrift_trainer.training.outputs.model_file import load_model
from thrift_trainer.wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

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


def test_a_completed_run_extended_to_more_rounds_ends_as_the_longer_run(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    cluster.start_coordinator(2, "--deterministic")
    short = [*TRAIN[:1], str(ROUNDS - 2), *TRAIN[2:]]
    assert len(cluster.train_json(*short, "--run-id", "longer")["history"]) == ROUNDS - 2
    cluster.coordinator.stop()

    nodes_file = cluster.workdir / "compute_nodes.txt"
    cluster.coordinator = procs.start_coordinator(cluster.workdir, nodes_file, 2,
                                                  "--deterministic", "--resume", "longer",
                                                  "--rounds", str(ROUNDS))
    attached = procs.run_client(["attach", "127.0.0.1", str(cluster.coordinator.port),
                                 "longer", "--json", "--poll", "0.2"], cluster.workdir)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    assert json.loads(attached.stdout)["state"] == "completed"
    assert f"round {ROUNDS - 2}/{ROUNDS}" not in cluster.coordinator.log()  # not done again
    cluster.train_json(*TRAIN, "--run-id", "reference")

    expected, extended = _model(cluster, "reference"), _model(cluster, "longer")
    for name in expected:
        assert np.array_equal(expected[name], extended[name]), name  # bit for bit
    assert _completed_per_round(cluster, "longer") == _completed_per_round(cluster, "reference")
    rows = (cluster.workdir / "runs" / "longer" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == list(range(1, ROUNDS + 1))


def test_extending_a_run_needs_resume_and_more_rounds(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    cluster.train_json("letters", "2", "1", "8", "0.01", "--run-id", "done")
    cluster.coordinator.stop()
    nodes_file = cluster.workdir / "compute_nodes.txt"
    base = [sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2",
            "--nodes-file", str(nodes_file), "--run-dir", str(cluster.workdir / "runs")]
    for extra, code, message in (
            (["--resume", "done", "--rounds", "2"], 1,
             "extending run done needs more than the 2 rounds it was asked for, got 2"),
            (["--resume", "done"], 1, "run done is completed: it cannot be resumed "
                                      "(extend it with more rounds)"),
            (["--rounds", "5"], 2, "--rounds extends a run: it needs --resume RUN_ID")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=60,
                              env=procs.python_env())
        assert proc.returncode == code and message in proc.stderr, (extra, proc.stderr)


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


def _store_rows(cluster, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(cluster.workdir / "runs" / "runs.db")) as db:
        return db.execute(sql, params).fetchall()


def _resume_and_attach(cluster, run_id: str, nodes: list[procs.Proc]) -> dict:
    """Restart the coordinator on `nodes` with --resume and follow the run to its end."""
    nodes_file = procs.write_nodes_file(cluster.workdir / "compute_nodes.txt", nodes)
    cluster.coordinator = procs.start_coordinator(cluster.workdir, nodes_file, 2,
                                                  "--resume", run_id)
    attached = procs.run_client(["attach", "127.0.0.1", str(cluster.coordinator.port),
                                 run_id, "--json", "--poll", "0.2"], cluster.workdir)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    return json.loads(attached.stdout)


def test_a_run_killed_before_its_first_checkpoint_resumes_from_round_1(cluster):
    # Every unit on this node waits 60 s first (policy 1, load 1): round 1 cannot end.
    slow = cluster.add_node(1.0, "--load-delay", "60")
    cluster.start_coordinator(1)
    client = cluster.start_client(*TRAIN, "--run-id", "early", "--quiet", "--dead-after", "3")
    try:
        slow.wait_for(r"round 1 accepted", timeout=60)
        cluster.coordinator.kill()
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    run_dir = cluster.workdir / "runs" / "early"
    assert "--resume early" in err and not (run_dir / "checkpoint.npz").exists()
    out_when_killed = _store_rows(cluster, "SELECT COUNT(*) FROM attempts WHERE run_id = ?",
                                  ("early",))[0][0]
    assert out_when_killed >= 1

    fast = [cluster.add_node(0.0), cluster.add_node(0.0)]
    assert _resume_and_attach(cluster, "early", fast)["state"] == "completed"
    cluster.coordinator.wait_for(r"resumes after round 0")
    assert (run_dir / "model.npz").is_file()
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == list(range(1, ROUNDS + 1))
    # The attempts that were out on the slow node when the coordinator died are settled.
    assert _store_rows(cluster, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND "
                                "status = 'in_progress'", ("early",)) == [(0,)]
    assert _store_rows(cluster, "SELECT DISTINCT reason FROM attempts WHERE run_id = ? AND "
                                "node = ?", ("early", f"127.0.0.1:{slow.port}")) == [
        ("the coordinator stopped during the run",)]


ASYNC_TRAIN = ["--config", str(procs.REPO / "configs" / "letters_async.yaml"), "--set",
               f"run.rounds={ROUNDS}", "--set", "delta_avg.epochs=1"]


@pytest.mark.parametrize("train", [TRAIN, ASYNC_TRAIN], ids=["sync", "async"])
def test_a_run_killed_after_its_last_checkpoint_resumes_to_its_end_writes(cluster, train):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    cluster.train_json(*train, "--run-id", "late")
    cluster.coordinator.stop()
    # What a kill -9 between the last checkpoint and the end of the run leaves: every
    # round recorded and checkpointed, the run still running, no final model yet.
    run_dir = cluster.workdir / "runs" / "late"
    expected = _model(cluster, "late")
    for name in ("model.npz", "curves.png"):
        (run_dir / name).unlink()
    with closing(sqlite3.connect(cluster.workdir / "runs" / "runs.db")) as db, db:
        db.execute("UPDATE runs SET state = 'running', ended = NULL WHERE id = 'late'")

    assert _resume_and_attach(cluster, "late", cluster.nodes)["state"] == "completed"
    resumed = _model(cluster, "late")
    assert expected.keys() == resumed.keys()
    assert all(np.array_equal(expected[k], resumed[k]) for k in expected)
    assert (run_dir / "curves.png").is_file()
    assert _store_rows(cluster, "SELECT state, (SELECT COUNT(*) FROM rounds WHERE run_id = "
                                "'late') FROM runs WHERE id = 'late'") == [("completed", ROUNDS)]
    cluster.coordinator.stop()
    again = subprocess.run(
        [sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2", "--nodes-file",
         str(cluster.workdir / "compute_nodes.txt"), "--run-dir", str(cluster.workdir / "runs"),
         "--resume", "late"], capture_output=True, text=True, timeout=60, env=procs.python_env())
    assert again.returncode == 1 and "run late is completed" in again.stderr


def test_a_store_that_cannot_be_written_fails_the_run_loudly(cluster, monkeypatch):
    # The store file may not grow past this many pages: SQLite fails its writes with
    # SQLITE_FULL ("database or disk is full"), as on a full disk, a few rounds in.
    monkeypatch.setenv("TRAINER_STORE_MAX_PAGES", "24")
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    done = cluster.client("letters", "40", *TRAIN[2:], "--run-id", "full", "--quiet")
    store = cluster.workdir / "runs" / "runs.db"
    assert done.returncode == 1, done.stdout + cluster.logs()
    assert done.stderr.strip().splitlines() == [
        f"error: training failed: run store {store}: database or disk is full"]
    assert f"run full: run store {store}: database or disk is full" in cluster.coordinator.log()
    assert cluster.coordinator.alive()
    # Nothing checkpointed (what a resume would build on) that the store does not hold.
    recorded = _store_rows(cluster, "SELECT COUNT(*) FROM rounds WHERE run_id = 'full'")[0][0]
    assert 1 <= _checkpoint_round(cluster, "full") <= recorded < 40
    assert _store_rows(cluster, "SELECT state FROM runs WHERE id = 'full'") != [("completed",)]


def _checkpoint_round(cluster, run_id: str) -> int:
    _, meta = load_model(cluster.workdir / "runs" / run_id / "checkpoint.npz")
    return int(meta["round"])


def test_a_second_coordinator_on_the_same_store_is_refused(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    first = cluster.start_coordinator(2)
    client = cluster.start_client(*TRAIN, "--run-id", "first", "--json", "--quiet")
    second = None
    try:
        first.wait_for(r"round 1/6", timeout=60)
        second = subprocess.Popen(
            [sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2", "--host",
             "127.0.0.1", "--nodes-file", str(cluster.workdir / "compute_nodes.txt"),
             "--run-dir", str(cluster.workdir / "runs")], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=procs.python_env())
        _, second_err = second.communicate(timeout=60)
        out, err = client.communicate(timeout=120)
    finally:
        for proc in (second, client):
            if proc is not None and proc.poll() is None:
                proc.kill()
    store = cluster.workdir / "runs" / "runs.db"
    assert second.returncode == 1
    assert second_err.strip().splitlines()[-1] == (
        f"error: run store {store} is in use by another coordinator (pid {first.popen.pid})")
    assert client.returncode == 0, err + cluster.logs()
    assert _store_rows(cluster, "SELECT state FROM runs WHERE id = 'first'") == [("completed",)]


def test_a_store_truncated_under_the_coordinator_leaves_the_fault_in_its_log(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    cluster.train_json("letters", "1", *TRAIN[2:], "--run-id", "before")
    # Truncating the WAL index that SQLite has memory-mapped makes its next access a
    # SIGBUS: the process cannot survive it, but it must not die without a word.
    os.truncate(cluster.workdir / "runs" / "runs.db-shm", 0)
    cluster.client("letters", "1", *TRAIN[2:], "--run-id", "after", "--dead-after", "3",
                   timeout=60)
    cluster.coordinator.popen.wait(30)
    assert cluster.coordinator.popen.returncode == -signal.SIGBUS
    cluster.coordinator.wait_for(r"Fatal Python error: Bus error")
    assert "run_store.py" in cluster.coordinator.log()


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


def test_a_discarded_unit_is_said_in_the_progress_and_the_summary_with_its_reason(cluster):
    """Silent before: a unit given up after its failures only showed in the coordinator's
    log, while the client's figures looked like those of a whole run."""
    cluster.add_node(0.0)
    spoiler = cluster.add_node(0.0, "--corrupt-updates", "nan")
    # Random: the spoiler gets some units. No backups: on a busy machine a backup still
    # out would decide a spoiled unit instead of its failure.
    cluster.start_coordinator(1, "--max-unit-failures", "1", "--no-speculation")
    done = cluster.client("letters", "1", "1", "16", "0.01", "--run-id", "discards")
    assert done.returncode == 0, done.stderr + cluster.logs()
    said = re.search(r"Units discarded (\d+) \(last: unit \S+ on 127\.0\.0\.1:(\d+): "
                     r"invalid result: [^\n]*NaN", done.stdout)
    assert said and int(said[1]) >= 1 and said[2] == str(spoiler.port), done.stdout
    assert re.search(r"round 1/1 completed .*discarded \d+ \(last: unit", done.stderr)
