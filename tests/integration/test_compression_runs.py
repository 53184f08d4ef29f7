"""Compressed updates and weights through real node and coordinator processes."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from devtools.local_cluster import REPO, run_client, start_pull_node

RECOMMENDED = ["--config", str(REPO / "configs" / "letters_recommended.yaml"),
               "--set", "run.rounds=3", "--set", "run.deterministic=true",
               "--set", "delta_avg.epochs=1"]  # the codecs, not the local training, are tested


def _run(cluster, *settings: str) -> dict:
    sets = [item for setting in settings for item in ("--set", setting)]
    return cluster.train_json(*RECOMMENDED, *sets, timeout=300.0)


def test_each_codec_trains_letters_and_the_client_reports_the_bytes(cluster):
    for _ in range(2):
        cluster.add_node(0.0)
    cluster.start_coordinator(2)
    plain = _run(cluster)
    assert plain["aggregation"] == "mean"
    assert plain["compression"]["up"] == "none" and plain["compression"]["down"] == "none"
    units = 3 * 11
    # every unit brings an update up: hidden [128, 128] float64, about 180 kB; the weights
    # (as big) go down at least once per node and round, and far less than once per unit
    # (a node's later units of a round refer to the weights it kept)
    assert plain["bytes_up"] > units * 170_000
    assert 2 * 3 * 170_000 < plain["bytes_down"] < units * 170_000 * 0.8

    runs = {codec: _run(cluster, f"compression.up={codec}") for codec in ("fp16", "int8")}
    runs["topk"] = _run(cluster, "compression.up=topk", "compression.topk_fraction=0.01")
    for codec, result in runs.items():
        assert result["compression"]["up"] == codec
    for codec in ("fp16", "int8"):
        assert abs(runs[codec]["validation_error"] - plain["validation_error"]) < 0.02, codec
    # topk's accuracy depends on which node holds which residual (scheduling), and 3 rounds
    # of 1 % move the model little: bench/compression.py measures it; here it must run.
    assert len(runs["topk"]["history"]) == 3
    assert runs["fp16"]["bytes_up"] < plain["bytes_up"] / 3.5  # float64 -> float16
    assert runs["int8"]["bytes_up"] < plain["bytes_up"] / 7
    assert runs["topk"]["bytes_up"] * 10 <= plain["bytes_up"]
    assert runs["topk"]["compression"]["topk_fraction"] == 0.01
    _each_slot_stayed_on_one_node(cluster.workdir / "runs" / "runs.db")

    down = _run(cluster, "compression.down=fp16")
    assert down["compression"]["down"] == "fp16"
    # how many units carry the weights depends on timing: bound it by every unit carrying
    # them, fp16 against float64
    assert down["bytes_down"] < units * 180_000 / 3.5
    assert abs(down["validation_error"] - plain["validation_error"]) < 0.05

    summary = cluster.client(*RECOMMENDED, "--set", "run.rounds=1", "--set",
                             "compression.up=int8", "--quiet", timeout=300.0)
    assert summary.returncode == 0, summary.stderr
    assert "Bytes up: " in summary.stdout and "compression: up int8, down none" \
        in summary.stdout and "aggregation: mean" in summary.stdout


def _each_slot_stayed_on_one_node(store: Path) -> None:
    """The latest run's units (topk): every round's unit of a slot ran on the node that
    holds the slot's residual, once (no backup attempt on another node)."""
    with closing(sqlite3.connect(store)) as db:
        run_id = db.execute("SELECT id FROM runs ORDER BY created DESC LIMIT 1").fetchone()[0]
        rows = db.execute("SELECT unit_id, round, node FROM attempts WHERE run_id = ?",
                          (run_id,)).fetchall()
    nodes: dict[str, set[str]] = {}
    for unit_id, _, node in rows:
        nodes.setdefault(unit_id, set()).add(node)
    assert len(rows) == 3 * 11 and len(nodes) == 11, rows
    assert all(len(held) == 1 for held in nodes.values()), nodes
    assert len(set().union(*nodes.values())) == 2  # both nodes hold some slots


def test_bad_compression_settings_are_refused_before_the_run_starts(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    cases = [
        (["--set", "compression.up=zip"], "compression.up: unknown codec 'zip'"),
        (["--set", "compression.up=topk", "--set", "compression.topk_fraction=0"],
         "compression.topk_fraction"),
        (["--set", "compression.down=int8"], "compression.down: unknown codec 'int8'"),
    ]
    for extra, message in cases:
        done = cluster.client(*RECOMMENDED, *extra, "--quiet", timeout=120.0)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    mdgan = cluster.client("--config", str(REPO / "configs" / "md_gan_mnist.yaml"),
                           "--set", "compression.up=fp16", "--quiet", timeout=120.0)
    assert mdgan.returncode == 2 and "compression.up: md_gan cannot use 'fp16'" \
        in mdgan.stderr, mdgan.stderr
    status = run_client(["runs", "127.0.0.1", str(cluster.coordinator.port), "--json"],
                        cluster.workdir)
    assert status.returncode == 0 and status.stdout.strip() == "[]", status.stdout


def test_pull_nodes_count_their_bytes_too(cluster):
    cluster.add_node(1.0)  # listed in compute_nodes.txt, rejects every unit
    coordinator = cluster.start_coordinator(2)
    pull = start_pull_node(cluster.workdir, "pull1", coordinator.port, 0.0)
    cluster.nodes.append(pull)  # stopped with the cluster
    coordinator.wait_for(r"node pull:pull1 registered")
    result = cluster.train_json(*RECOMMENDED, "--set", "run.rounds=2", timeout=300.0)
    accepted = {n["pull"]: n["accepted"] for n in result["nodes"]}
    assert accepted == {True: 22, False: 0}, result["nodes"]
    # every unit the pull node trained brought about 180 kB of update up
    assert result["bytes_up"] > 22 * 170_000 and result["bytes_down"] > 22 * 170_000
