"""Asynchronous and buffered runs through real node, coordinator and client processes."""

from __future__ import annotations

import json
import re
import sqlite3

from devtools import local_cluster as procs
from devtools.local_cluster import REPO, run_client, start_pull_node
from tests.integration.test_training_runs import assert_one_record

RECOMMENDED = ["--config", str(REPO / "configs" / "letters_recommended.yaml")]
# Each result is applied on its own in async mode: a smaller server step than a round's.
ASYNC = [*RECOMMENDED, "--set", "schedule.mode=async", "--set", "delta_avg.server_lr=0.1"]


def status_of(cluster, run_id: str) -> dict:
    shown = run_client(["status", "127.0.0.1", str(cluster.coordinator.port), run_id,
                        "--json"], cluster.workdir)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def completed_per_round(cluster, run_id: str) -> dict[int, int]:
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        return dict(db.execute("SELECT round, COUNT(*) FROM units WHERE run_id = ? AND "
                               "status = 'completed' GROUP BY round", (run_id,)).fetchall())


def test_async_and_buffered_runs_mix_pull_and_pushed_nodes(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.5, "--load-delay", "0.2")  # policy 1: delays, never rejects
    coordinator = cluster.start_coordinator(1)
    pull = start_pull_node(cluster.workdir, "pull1", coordinator.port, 0.0)
    cluster.nodes.append(pull)  # stopped with the cluster
    coordinator.wait_for(r"node pull:pull1 registered")

    result = cluster.train_json(*ASYNC, "--set", "run.rounds=3", "--run-id", "a1",
                                timeout=300.0)
    assert result["validation_error"] < 0.3  # about 0.11 after 3 rounds
    accepted = {n["pull"]: n["accepted"] for n in result["nodes"]}
    assert accepted[True] > 0 and accepted[False] > 0, result["nodes"]
    assert_one_record(result, cluster)  # 33 results applied, each recorded once
    assert result["units"]["done"] == 33
    shown = status_of(cluster, "a1")
    assert (shown["mode"], shown["model_version"]) == ("async", 33)
    # 33 results are three passes over the 11 shards; the fourth may have begun, its
    # units waiting
    assert shown["pass"] in (3, 4) and shown["todo"] <= 11
    assert completed_per_round(cluster, "a1") == {1: 11, 2: 11, 3: 11}

    buffered = cluster.train_json(*ASYNC, "--set", "schedule.mode=buffered",
                                  "--set", "schedule.buffer_size=2", "--set", "run.rounds=2",
                                  "--set", "schedule.prefetch=1",  # two units out per node
                                  "--run-id", "b1", timeout=300.0)
    assert buffered["units"]["done"] == 24  # ceil(11 / 2) versions of 2 results per round
    assert status_of(cluster, "b1")["model_version"] == 12


def test_an_async_run_resumes_after_a_kill_and_applies_no_result_twice(cluster):
    for _ in range(2):
        cluster.add_node(0.0)
    cluster.start_coordinator(2)
    client = cluster.start_client(*ASYNC, "--set", "run.rounds=8", "--run-id", "crashed",
                                  "--quiet", "--dead-after", "3")
    try:
        cluster.coordinator.wait_for(r"round 3/8", timeout=120)
        cluster.coordinator.kill()  # SIGKILL: results in flight and in the buffer are lost
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1 and "--resume crashed" in err

    cluster.coordinator = procs.start_coordinator(
        cluster.workdir, cluster.workdir / "compute_nodes.txt", 2, "--resume", "crashed")
    attached = run_client(["attach", "127.0.0.1", str(cluster.coordinator.port), "crashed",
                           "--json", "--poll", "0.2"], cluster.workdir, timeout=300)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    assert json.loads(attached.stdout)["state"] == "completed"
    resumed_after = int(cluster.coordinator.wait_for(r"resumes after round (\d+)").group(1))
    assert resumed_after >= 2  # the log line of round 3 comes just before its checkpoint
    # every round's versions took exactly its 11 results: none lost, none applied twice
    assert completed_per_round(cluster, "crashed") == {r: 11 for r in range(1, 9)}
    rows = (cluster.workdir / "runs" / "crashed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == list(range(1, 9))
    assert json.loads(rows[-1])["validation_error"] < 0.15
    shown = status_of(cluster, "crashed")
    assert not {k: v for k, v in shown["ledger"].items()
                if k not in ("completed", "cancelled") and v}, shown["ledger"]


def test_a_result_older_than_max_staleness_is_refused_and_its_unit_computed_again(cluster):
    fast = cluster.add_node(0.0)
    # ten times slower: the fast node makes about ten versions while it computes a unit;
    # it leaves on its second unit, so a refused unit is computed again by the fast node.
    # Six rounds: on a busy machine the slow unit takes two or three rounds' time, and a
    # run that ended first would cancel it instead of refusing its result.
    slow = cluster.add_node(0.0, "--slowdown", "10", "--crash-after-units", "1")
    cluster.start_coordinator(2, "--no-speculation")  # no backup may overtake the slow unit
    result = cluster.train_json(*ASYNC, "--set", "schedule.max_staleness=2",
                                "--set", "run.rounds=6", "--run-id", "bounded", timeout=300.0)
    assert result["units"]["done"] == 66 and result["units"]["stale"] >= 1, result["units"]
    assert completed_per_round(cluster, "bounded") == {r: 11 for r in range(1, 7)}
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        refused = db.execute("SELECT unit_id, attempt, node, reason FROM attempts WHERE "
                             "run_id = 'bounded' AND status = 'stale'").fetchall()
        kept = db.execute("SELECT unit_id, attempt, node FROM attempts WHERE "
                          "run_id = 'bounded' AND status = 'completed'").fetchall()
    assert refused, "no result was refused as stale"
    for unit_id, attempt, node, reason in refused:
        assert node == f"127.0.0.1:{slow.port}"
        behind = int(re.search(r"computed from version \d+, (\d+) behind \(max_staleness 2\)",
                               reason).group(1))
        assert behind > 2
        # computed again from fresher weights by the fast node, and kept once
        (again,) = [(a, n) for u, a, n in kept if u == unit_id]
        assert again[0] > attempt and again[1] == f"127.0.0.1:{fast.port}"


def test_bad_schedules_are_refused_before_the_run_naming_the_key(cluster):
    """The coordinator refuses them (exit 1 with its message, as for any refused request)."""
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    cases = [
        (["--set", "schedule.mode=buffered", "--set", "schedule.buffer_size=0"],
         "schedule.buffer_size"),
        (["--set", "schedule.mode=async", "--set", "schedule.max_staleness=-1"],
         "schedule.max_staleness"),
        (["--set", "schedule.mode=async", "--set", "compression.up=topk"], "compression.up"),
        (["--set", "schedule.prefetch=1"], "schedule.prefetch is for the async and buffered"),
    ]
    for extra, key in cases:
        done = cluster.client(*RECOMMENDED, *extra)
        assert done.returncode == 2 and key in done.stderr, (extra, done.stderr)
    md_gan = cluster.client("--config", str(REPO / "configs" / "md_gan_mnist.yaml"),
                            "--set", "schedule.mode=async")
    assert md_gan.returncode == 2 and "md_gan cannot train in 'async'" in md_gan.stderr
    cluster.coordinator.stop()
    cluster.start_coordinator(2, "--deterministic")
    done = cluster.client(*ASYNC)
    assert done.returncode == 2 and "'async' cannot be deterministic" in done.stderr
    runs = run_client(["runs", "127.0.0.1", str(cluster.coordinator.port), "--json"],
                      cluster.workdir)
    assert json.loads(runs.stdout) == []  # refused before any run was created
