"""What a new user meets first: a command started outside its environment, the list of
runs, and stopping a client with SIGTERM as with Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from devtools.local_cluster import REPO, python_env, run_client

ANSWER_SECONDS = 60.0


@pytest.mark.parametrize("script", ["client.py", "compute_node.py", "coordinator_node.py"])
def test_a_command_without_its_requirements_says_how_to_set_up(script, tmp_path):
    """-S leaves out site-packages: the interpreter a user gets without the virtual
    environment, where rich, thrift, numpy... are missing."""
    done = subprocess.run([sys.executable, "-S", str(REPO / script), "--help"], cwd=tmp_path,
                          env=python_env(), capture_output=True, text=True,
                          timeout=ANSWER_SECONDS)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "scripts/setup.sh" in done.stderr and "source .venv/bin/activate" in done.stderr


def test_runs_lists_a_line_per_run_and_the_nodes_on_request(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    for run_id in ("first", "second"):
        cluster.train_json("letters", "1", "1", "20", "0.0001", "--run-id", run_id)
    port = str(cluster.coordinator.port)
    runs = run_client(["runs", "127.0.0.1", port], cluster.workdir)
    assert runs.returncode == 0, runs.stderr
    lines = runs.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["second", "first"]  # a header, a line each
    with_nodes = run_client(["runs", "127.0.0.1", port, "--nodes"], cluster.workdir)
    assert with_nodes.returncode == 0, with_nodes.stderr
    assert with_nodes.stdout.count("Units per node") == 2
    for node in cluster.nodes:
        assert f"127.0.0.1:{node.port}" in with_nodes.stdout


def test_sigterm_cancels_the_run_as_ctrl_c_does(cluster):
    cluster.add_node(1.0, "--load-delay", "30")  # every unit waits 30 s: the run is slow
    cluster.start_coordinator(1, "--no-speculation")
    client = cluster.start_client("letters", "3", "15", "20", "0.0001", "--quiet",
                                  "--run-id", "stopped")
    try:
        cluster.nodes[0].wait_for(r"unit \S+ round \d+ accepted")
        client.send_signal(signal.SIGTERM)
        _, err = client.communicate(timeout=ANSWER_SECONDS)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 143, err
    assert "cancelled" in err and "Traceback" not in err
    after = run_client(["status", "127.0.0.1", str(cluster.coordinator.port), "stopped",
                        "--json"], cluster.workdir)
    assert json.loads(after.stdout)["state"] == "cancelled"
