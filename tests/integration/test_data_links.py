"""A data set holding a link to a file outside the data root, through real coordinator,
node and client processes on 127.0.0.1: refused in one line naming the link, by the
coordinator and by a node, unless the operator started them with --follow-data-links."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import Cluster

REFUSED = 2  # the client's exit status for a request the coordinator refuses
FAILED = 1  # ... and for a run that fails (no node can serve it)
FOLLOW = "--follow-data-links"
RUN = ["--set", "run.algorithm=delta_avg", "--set", "run.model=mlp_classifier",
       "--set", "run.dataset=tab", "--set", "data.format=csv", "--set", "data.header='no'",
       "--set", "run.rounds=1", "--set", "delta_avg.units=2",
       "--set", "delta_avg.local_steps=2", "--set", "delta_avg.local_optimizer=sgd",
       "--set", "delta_avg.eta=0.01"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root whose data set `tab` holds train.csv, a link to a file outside it."""
    outside = tmp_path / "outside" / "train.csv"
    outside.parent.mkdir()
    outside.write_text("".join(f"{i % 7},{i % 5},{i % 2}\n" for i in range(60)))
    (tmp_path / "data" / "tab").mkdir(parents=True)
    (tmp_path / "data" / "tab" / "train.csv").symlink_to(outside)
    return tmp_path / "data"


def train(cluster: Cluster) -> subprocess.CompletedProcess:
    return cluster.client(*RUN, timeout=180)


def last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""


def test_a_link_out_of_the_data_root_is_refused_by_the_coordinator_and_by_a_node(
        cluster: Cluster, root: Path) -> None:
    node = cluster.add_node(0.0, "--data-root", str(root))
    cluster.start_coordinator(2, "--data-root", str(root))
    done = train(cluster)
    assert done.returncode == REFUSED, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "tab/train.csv" in last_line(done) and FOLLOW in last_line(done), done.stderr

    cluster.coordinator.stop()  # one that follows links: the node still refuses them
    cluster.start_coordinator(2, "--data-root", str(root), FOLLOW)
    done = train(cluster)
    assert done.returncode == FAILED, done.stdout + done.stderr
    line = last_line(done)
    assert f"no node can serve this run: node 127.0.0.1:{node.port}" in line, done.stderr
    assert "tab/train.csv" in line and FOLLOW in line, done.stderr
    assert "round 1/" not in done.stdout
    assert "Traceback" not in done.stderr + cluster.logs(), cluster.logs()


def test_with_following_links_on_a_linked_file_is_read(cluster: Cluster, root: Path) -> None:
    cluster.add_node(0.0, "--data-root", str(root), FOLLOW)
    cluster.start_coordinator(2, "--data-root", str(root), FOLLOW)
    result = cluster.train_json(*RUN, timeout=180)
    assert result["units"]["done"] == 2, result
