"""The three user commands as a user runs them: output, exit codes, failures, Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest

from devtools.local_cluster import (
    REPO,
    python_env,
    run_client,
    start_coordinator,
    start_node,
    start_pull_node,
)


def run_script(script: str, *args: str, cwd=REPO, timeout: float = 60.0):
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd,
                          env=python_env(), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("script, words", [
    ("compute_node.py", ["port", "load_prob", "--data-root", "--load-delay", "--seed"]),
    ("coordinator_node.py", ["policy", "--nodes-file", "--run-dir", "--data-root", "--grace"]),
    ("client.py", ["coordinator_ip", "rounds", "epochs", "eta", "--json", "--quiet"]),
])
def test_help_documents_every_argument(script, words):
    done = run_script(script, "--help")
    assert done.returncode == 0
    for word in words:
        assert word in done.stdout


@pytest.mark.parametrize("script, args", [
    ("client.py", ["localhost", "9095", "letters", "five", "15", "20", "0.0001"]),
    ("client.py", ["localhost", "9095", "letters", "5"]),
    ("compute_node.py", ["9091", "1.5"]),
    ("coordinator_node.py", ["9095", "7"]),
    ("coordinator_node.py", ["70000", "2"]),
    ("coordinator_node.py", ["0", "2", "--grace", "nan"]),
    ("coordinator_node.py", ["0", "2", "--heartbeat", "0"]),
    ("compute_node.py", ["0", "0.2", "--load-delay", "inf"]),
    ("client.py", ["localhost", "9095", "letters", "1", "1", "20", "0.1", "--poll", "-3"]),
])
def test_bad_arguments_print_usage_and_exit_2(script, args):
    done = run_script(script, *args)
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_coordinator_is_one_line_and_non_zero(tmp_path):
    done = run_client(["127.0.0.1", str(free_port()), "letters", "1", "1", "20", "0.1"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "cannot reach the coordinator" in done.stderr


def test_missing_data_directory_names_the_path(cluster):
    cluster.add_node()
    cluster.start_coordinator(2)
    done = cluster.client("no_such_set", "1", "1", "20", "0.1", "--quiet")
    assert done.returncode == 2  # a bad configuration
    assert "no_such_set" in done.stderr and "does not exist" in done.stderr


@pytest.mark.parametrize("content, expected", [
    ("localhost,9091\nlocalhost 9092\n", "line 2"),
    ("localhost,port\n", "line 1"),
])
def test_bad_nodes_file_is_a_clear_error(tmp_path, content, expected):
    nodes = tmp_path / "nodes.txt"
    if content is not None:
        nodes.write_text(content)
    done = run_script("coordinator_node.py", "0", "2", "--nodes-file", str(nodes), cwd=tmp_path)
    assert done.returncode == 1
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("content, said", [
    (None, "not found"),
    ("# only a comment\n\n", "lists no compute node"),
])
def test_without_listed_nodes_the_coordinator_trains_on_nodes_that_register(
        tmp_path, content, said):
    nodes = tmp_path / "nodes.txt"
    if content is not None:
        nodes.write_text(content)
    coordinator = start_coordinator(tmp_path, nodes)
    try:
        line = coordinator.wait_for(rf"{said}.*only nodes that register")
        pulled = start_pull_node(tmp_path, "laptop", coordinator.port)
        try:
            coordinator.wait_for(r"node pull:laptop registered")
            done = run_client(["127.0.0.1", str(coordinator.port), "letters", "1", "2", "16",
                               "0.01", "--json", "--quiet"], tmp_path)
        finally:
            pulled.stop()
    finally:
        coordinator.stop()
    assert done.returncode == 0, done.stderr + coordinator.log()
    assert [n["node"] for n in json.loads(done.stdout)["nodes"]] == ["pull:laptop"]
    assert coordinator.log().count(line.group(0)) == 1  # said once, at start


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "LOCALHOST"])
def test_the_coordinators_own_address_in_the_nodes_file_is_refused_at_start(tmp_path, host):
    port = free_port()
    nodes = tmp_path / "nodes.txt"
    nodes.write_text(f"{host},{port}\n")
    done = run_script("coordinator_node.py", str(port), "2", "--host", "127.0.0.1",
                      "--nodes-file", str(nodes), cwd=tmp_path)
    assert done.returncode == 1
    assert f"{host}:{port} is this coordinator's own address" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_three_commands_train_and_report(cluster):
    cluster.add_node(0.2, "--load-delay", "0.1")
    cluster.add_node(0.4, "--load-delay", "0.1")
    cluster.start_coordinator(2)
    done = cluster.client("letters", "2", "15", "20", "0.0001", "--compat", "--out", "models")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Final validation error: 0.9277" in out
    assert "Rounds: 2" in out and "Wall time" in out
    for column in ("accepted", "rejected", "delayed", "failed"):
        assert column in out
    model_line = next(line for line in out.splitlines() if line.startswith("Model saved to:"))
    assert (cluster.workdir / model_line.split(": ", 1)[1]).is_file()
    status = run_client(
        ["status", "127.0.0.1", str(cluster.coordinator.port), "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "completed"


def test_ctrl_c_cancels_the_run_cleanly(cluster):
    cluster.add_node(1.0, "--load-delay", "30")  # every unit waits 30 s: the run is slow
    cluster.start_coordinator(1, "--no-speculation")
    client = cluster.start_client(
        "letters", "3", "15", "20", "0.0001", "--quiet")
    try:
        run_id = cluster.coordinator.wait_for(r"run (\S+): delta_avg").group(1)
        cluster.nodes[0].wait_for(r"unit \S+ round \d+ accepted")
        client.send_signal(signal.SIGINT)
        # The client gives the cancel 5 s and the run 15 s to end: well under this bound,
        # which leaves room for a loaded machine.
        try:
            _, err = client.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the client did not end after Ctrl-C\n{cluster.logs()}") from None
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 130
    assert "cancelled" in err
    after = run_client(["status", "127.0.0.1", str(cluster.coordinator.port), run_id,
                        "--json"], cluster.workdir)
    assert json.loads(after.stdout)["state"] == "cancelled"


def test_client_notices_a_dead_coordinator(cluster):
    cluster.add_node(1.0, "--load-delay", "30")
    cluster.start_coordinator(1, "--no-speculation")
    client = cluster.start_client(
        "letters", "3", "15", "20", "0.0001", "--quiet", "--dead-after", "3")
    try:
        cluster.nodes[0].wait_for(r"unit \S+ round \d+ accepted")
        cluster.coordinator.kill()
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1
    assert "coordinator" in err
    assert "Traceback" not in err


def test_sigterm_stops_the_coordinator_gracefully_and_tells_the_client(cluster):
    cluster.add_node(1.0, "--load-delay", "30")
    cluster.start_coordinator(1, "--no-speculation")
    client = cluster.start_client(
        "letters", "3", "15", "20", "0.0001", "--quiet")
    try:
        cluster.nodes[0].wait_for(r"unit \S+ round \d+ accepted")
        cluster.coordinator.popen.send_signal(signal.SIGTERM)
        assert cluster.coordinator.popen.wait(timeout=20) == 0
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 3  # the coordinator cancelled the run
    assert "shutting down" in err


@pytest.mark.parametrize("device, message", [
    ("tpu", "unknown device 'tpu'"),
    ("cuda:99", "cuda:99"),
])
def test_a_node_refuses_a_device_it_cannot_use(device, message):
    done = run_script("compute_node.py", "0", "0.1", "--device", device)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_node_started_by_hand_reports_the_threads_it_uses(tmp_path):
    default = start_node(tmp_path, "plain", 0.0)
    chosen = start_node(tmp_path, "four", 0.0, "--threads", "4")
    try:
        assert "1 thread)" in default.log()
        assert "4 threads)" in chosen.log()
    finally:
        default.stop()
        chosen.stop()
