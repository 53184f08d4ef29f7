"""Bad plug-ins through real processes: each gets one line naming the plug-in (and the node,
where one node is at fault), and the run is refused before round 1 or goes on without that
node; never a traceback or a hang. A node started with a plug-in it cannot import exits 2.
A pushed node is checked before round 1 and never gets a unit; a pull node or a relay's
member checks itself with its first unit, and no result of it is kept."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path

import pytest

from devtools import local_cluster as procs
from devtools.local_cluster import REPO, python_env
from tests.conftest import Cluster
from tests.integration.test_relays import relay_over

# The plug-in module every process of these tests allows: a model, the broken variants,
# and a data set of the rows of numbers.csv under the process's data root.
MY_MODELS = '''
import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

HIDDEN = {hidden}
DTYPE = torch.{dtype}


class Net(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, HIDDEN), nn.ReLU(),
                                    nn.Linear(HIDDEN, num_classes))
        self.to(DTYPE)

    def forward(self, x):
        return self.layers(x)


class Broken(Net):
    def forward(self, x):
        raise RuntimeError("this forward always fails")


def not_a_module():
    return "a string"


def nan_loss(model, inputs, targets):
    return model(inputs).sum() * float("nan")


def numbers(root):
    rows = np.loadtxt(root / "numbers.csv", delimiter=",", ndmin=2)
    return TensorDataset(torch.tensor(rows[:, :-1], dtype=torch.float32),
                         torch.tensor(rows[:, -1], dtype=torch.long))
'''
LETTERS = ["--set", "run.dataset=letters", "--set", "data.format=letters"]
REFUSED = 2  # the client's exit status for a request the coordinator refuses (bad configuration)
QUICK = ["--set", "run.rounds=1", "--set", "delta_avg.units=2",
         "--set", "delta_avg.local_steps=2", "--set", "delta_avg.local_optimizer=sgd",
         "--set", "delta_avg.eta=0.01"]


def write_plugin(folder: Path, hidden: int = 8, dtype: str = "float32") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_models.py").write_text(MY_MODELS.format(hidden=hidden, dtype=dtype))
    return folder


def write_numbers(root: Path, rows: int) -> Path:
    """A data root holding numbers.csv: two features and a label of 0 or 1 per row."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "numbers.csv").write_text(
        "".join(f"{i % 7},{i % 5},{i % 2}\n" for i in range(rows)))
    return root


def train(cluster: Cluster, *settings: str) -> subprocess.CompletedProcess:
    return cluster.client("--set", "run.algorithm=delta_avg", *QUICK, *settings,
                          "--run-id", "plugin-run", timeout=180)


def no_traceback(cluster: Cluster, *outputs: str) -> None:
    for text in (*outputs, cluster.logs()):
        assert "Traceback" not in text, cluster.logs()


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node and a coordinator allowing my_models, for the runs that are refused."""
    workdir = write_plugin(tmp_path_factory.mktemp("refusals"))
    cluster = Cluster(workdir)
    try:
        cluster.add_node(0.0, "--plugins", "my_models")
        cluster.start_coordinator(2, "--plugins", "my_models")
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize(("settings", "words"), [
    (["--set", "run.model=other_models:Net"],
     ["the coordinator lacks plug-in other_models: it allows my_models; start it with "
      "--plugins my_models,other_models"]),
    (["--set", "run.model=my_models:NoSuchNet"],
     ["my_models:NoSuchNet", "no attribute 'NoSuchNet'"]),
    (["--set", "run.model=my_models:not_a_module"], ["my_models:not_a_module", "nn.Module"]),
    (["--set", "run.model=my_models:Broken"], ["my_models:Broken", "this forward always fails"]),
    (["--set", "run.model=my_models:Net", "--set", "run.loss=my_models:nan_loss"],
     ["my_models:nan_loss", "is nan"]),
], ids=["module-missing", "attribute-missing", "not-a-module", "forward-raises", "nan-loss"])
def test_an_unusable_plugin_is_refused_before_the_run_with_one_line(serving, settings, words):
    done = train(serving, *LETTERS, *settings)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == REFUSED, done.stdout + done.stderr
    assert len(lines) == 1 and all(word in lines[0] for word in words), done.stderr
    assert "round 1" not in done.stdout
    assert serving.coordinator.alive() and serving.nodes[0].alive(), serving.logs()
    no_traceback(serving, done.stdout, done.stderr)


def left_out_line(done: subprocess.CompletedProcess, node, name: str | None = None) -> str:
    """The client's one line saying that ``node`` (or the node called ``name``: a pull
    node's) is left out of the run (shown with the progress on stderr and again in the
    summary)."""
    prefix = f"node {name or f'127.0.0.1:{node.port}'} is left out: "
    lines = {line for line in (done.stdout + done.stderr).splitlines() if prefix in line}
    assert len(lines) == 1, done.stdout + done.stderr
    return lines.pop()


def attempts_of(cluster: Cluster, name: str) -> list[tuple[str, str, str | None]]:
    """(unit, status, reason) of every attempt the run's ledger holds for node ``name``."""
    with closing(sqlite3.connect(cluster.workdir / "runs" / "runs.db")) as db:
        return db.execute("SELECT unit_id, status, reason FROM attempts WHERE run_id = "
                          "'plugin-run' AND node = ?", (name,)).fetchall()


def first_attempt_started(cluster: Cluster) -> float:
    """When the run's first attempt of a unit began (the ledger's wall clock)."""
    with closing(sqlite3.connect(cluster.workdir / "runs" / "runs.db")) as db:
        (started,) = db.execute("SELECT min(started) FROM attempts WHERE run_id = "
                                "'plugin-run'").fetchone()
    assert started is not None, cluster.logs()
    return started


def logged_at(proc: procs.Proc, pattern: str) -> float:
    """The wall-clock time of the first line of ``proc``'s log matching ``pattern`` (its
    local time, to the millisecond below)."""
    stamp = proc.wait_for(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*" + pattern,
                          timeout=0).group(1)
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class MixedRun:
    """One run of my_models:Net on the numbers data through a node that can serve it and
    five that cannot, each for its own reason: ``done`` is the client's outcome, the
    others the nodes left out."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        workdir = cluster.workdir
        write_plugin(workdir)
        root = write_numbers(workdir / "data", 60)
        serving = ("--plugins", "my_models", "--data-root", str(root))
        edited = write_plugin(workdir / "edited_copy")
        (edited / "my_models.py").write_text((edited / "my_models.py").read_text().replace(
            "return self.layers(x)", "return 2 * self.layers(x)"))
        cluster.add_node(0.0, *serving)
        self.lacking = cluster.add_node(0.0, "--data-root", str(root))
        self.other = cluster.add_node(0.0, *serving, "--plugin-dir",
                                      str(write_plugin(workdir / "other_copy", hidden=16)))
        self.short = cluster.add_node(0.0, "--plugins", "my_models", "--data-root",
                                      str(write_numbers(workdir / "short_data", 50)))
        self.double = cluster.add_node(0.0, *serving, "--plugin-dir",
                                       str(write_plugin(workdir / "double_copy",
                                                        dtype="float64")))
        self.stale = cluster.add_node(0.0, *serving, "--plugin-dir", str(edited))
        cluster.start_coordinator(2, *serving)
        self.done = train(cluster, "--set", "run.model=my_models:Net",
                          "--set", "run.dataset=my_models:numbers")


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedRun]:
    """The run the tests of nodes that cannot serve it check, each its own facts."""
    cluster = Cluster(tmp_path_factory.mktemp("mixed"))
    try:
        yield MixedRun(cluster)
    finally:
        cluster.stop()


def test_each_node_that_cannot_serve_the_run_is_left_out_with_its_line(mixed_run):
    """A node without the plug-in, one whose copy builds other parameter shapes and one
    whose data set is shorter: each left out with one line naming it and the plug-in; the
    run completes on the node that can serve it."""
    done, cluster = mixed_run.done, mixed_run.cluster
    assert done.returncode == 0, done.stderr + cluster.logs()
    assert left_out_line(done, mixed_run.lacking).endswith(
        "lacks plug-in my_models: it allows no plug-in module; start it with --plugins my_models")
    assert "builds model my_models:Net with other parameters" in left_out_line(
        done, mixed_run.other)
    assert left_out_line(done, mixed_run.short).endswith(
        "holds another copy of data set my_models:numbers: 45 training examples, the "
        "coordinator's 54")  # 10 % of the rows are held out for validation
    assert "Final validation error" in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_node_whose_copy_builds_the_parameters_in_another_dtype_is_left_out(mixed_run):
    """The same names and shapes, in float64 instead of the coordinator's float32: the
    model's fingerprint tells them apart before round 1, and the run completes on the
    node whose copy builds float32."""
    done, cluster, double = mixed_run.done, mixed_run.cluster, mixed_run.double
    assert done.returncode == 0, done.stderr + cluster.logs()
    assert ("builds model my_models:Net with other parameters (names, shapes or dtypes "
            "differ" in left_out_line(done, double))
    assert attempts_of(cluster, f"127.0.0.1:{double.port}") == []
    assert "Final validation error" in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_node_running_an_edited_forward_is_left_out_though_its_parameters_agree(mixed_run):
    """The same parameters, another forward(): no fingerprint of the parameters tells them
    apart, the plug-in's source does; the node is left out with one line and the run
    completes on the node that runs the coordinator's code."""
    done, cluster, stale = mixed_run.done, mixed_run.cluster, mixed_run.stale
    assert done.returncode == 0, done.stderr + cluster.logs()
    line = left_out_line(done, stale)
    assert "runs another version of plug-in my_models (sha256:" in line, line
    assert attempts_of(cluster, f"127.0.0.1:{stale.port}") == []
    assert "Final validation error" in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_node_left_out_before_round_1_is_never_given_a_unit(cluster):
    """Its line is said before the run's first unit goes out, and the ledger holds no
    attempt of it: the run did not find out by sending it a unit it refused."""
    write_plugin(cluster.workdir)
    cluster.add_node(0.0, "--plugins", "my_models")
    lacking = cluster.add_node(0.0)
    cluster.start_coordinator(2, "--plugins", "my_models")
    done = train(cluster, *LETTERS, "--set", "run.model=my_models:Net")
    assert done.returncode == 0, done.stderr + cluster.logs()
    assert left_out_line(done, lacking).endswith(
        "lacks plug-in my_models: it allows no plug-in module; start it with --plugins my_models")
    name = f"127.0.0.1:{lacking.port}"
    assert attempts_of(cluster, name) == [], cluster.logs()
    assert " unit " not in lacking.log(), lacking.log()
    said = logged_at(cluster.coordinator, re.escape(f"node {name} is left out of run"))
    assert said < first_attempt_started(cluster), cluster.logs()
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_pull_node_holding_another_copy_of_the_data_leaves_itself_out(cluster):
    """A pull node is not asked before round 1: it checks itself with the unit it leases,
    refuses it with its line, and the unit is computed by the other node."""
    write_plugin(cluster.workdir)
    root = write_numbers(cluster.workdir / "data", 60)
    cluster.add_node(0.0, "--plugins", "my_models", "--data-root", str(root))
    coordinator = cluster.start_coordinator(2, "--plugins", "my_models", "--data-root",
                                            str(root))
    short = procs.start_pull_node(cluster.workdir, "short", coordinator.port, 0.0,
                                  "--plugins", "my_models", "--data-root",
                                  str(write_numbers(cluster.workdir / "short_data", 50)))
    cluster.nodes.append(short)  # stopped with the cluster
    coordinator.wait_for(r"node pull:short registered")
    done = train(cluster, "--set", "run.model=my_models:Net",
                 "--set", "run.dataset=my_models:numbers")
    assert done.returncode == 0, done.stderr + cluster.logs()
    reason = ("holds another copy of data set my_models:numbers: 45 training examples, the "
              "coordinator's 54")
    assert left_out_line(done, short, "pull:short").endswith(reason)
    attempts = attempts_of(cluster, "pull:short")
    assert attempts and all(status != "completed" and reason in why
                            for _, status, why in attempts), attempts
    assert "done:" not in short.log(), short.log()
    assert "Final validation error" in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)
    short.stop()  # while its coordinator is up, so it is not left retrying to reach it


def test_a_relay_member_holding_another_copy_of_the_data_is_left_out_by_its_relay(cluster):
    """A relay's member is only checked with the slices it is given: it refuses its first
    with its line, the relay leaves it out and its other member computes the run."""
    write_plugin(cluster.workdir)
    root = write_numbers(cluster.workdir / "data", 60)
    serving = ("--plugins", "my_models", "--data-root", str(root))
    member = cluster.add_node(0.0, *serving)
    short = cluster.add_node(0.0, "--plugins", "my_models", "--data-root",
                             str(write_numbers(cluster.workdir / "short_data", 50)))
    relay = relay_over(cluster, "relay", [member, short], *serving)
    cluster.start_coordinator(2, *serving, nodes=[relay])
    done = train(cluster, "--set", "run.model=my_models:Net",
                 "--set", "run.dataset=my_models:numbers")
    assert done.returncode == 0, done.stderr + cluster.logs()
    relay.wait_for(re.escape(
        f"node 127.0.0.1:{short.port} is left out of run plugin-run: holds another copy of "
        "data set my_models:numbers: 45 training examples, the coordinator's 54"), timeout=0)
    assert "this node cannot serve the run" in short.log(), short.log()
    assert "done:" not in short.log() and "done:" in member.log(), cluster.logs()
    assert "is left out" not in done.stdout + done.stderr  # the relay itself serves the run
    assert "Final validation error" in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_run_no_node_can_serve_fails_before_round_1_with_that_line(cluster):
    write_plugin(cluster.workdir)
    lacking = cluster.add_node(0.0)
    cluster.start_coordinator(2, "--plugins", "my_models")
    done = train(cluster, *LETTERS, "--set", "run.model=my_models:Net")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: training failed: no node can serve this run: node 127.0.0.1:{lacking.port} "
        f"lacks plug-in my_models: it allows no plug-in module; start it with --plugins "
        f"my_models (nodes tried: "
        f"127.0.0.1:{lacking.port})")
    assert "round 1/" not in done.stdout
    no_traceback(cluster, done.stdout, done.stderr)


def test_a_node_started_with_a_missing_plugin_module_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "compute_node.py"), "0", "0", "--host", "127.0.0.1",
         "--plugins", "no_such_module"], cwd=tmp_path, env=python_env(),
        capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    named = [line for line in output.splitlines() if "no_such_module" in line]
    assert named == [output.strip().splitlines()[-1]], output
    assert "plug-in module no_such_module is not found" in named[0]
    assert "Traceback" not in output
