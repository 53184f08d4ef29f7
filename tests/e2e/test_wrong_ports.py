"""A command pointed at the wrong port says which mistake it is: the dashboard's HTTP
port instead of the coordinator's, a compute node instead of the coordinator, or an
HTTP client (curl, a browser) on a Thrift port."""

from __future__ import annotations

import socket

import pytest

from devtools.local_cluster import run_client

ANSWER_SECONDS = 30.0
# Client commands, with PORT for the port under test.
TRAIN = ["127.0.0.1", "PORT", "letters", "1", "1", "20", "0.1"]
STATUS = ["status", "127.0.0.1", "PORT"]
RUNS = ["runs", "127.0.0.1", "PORT"]


def client_at(cluster, command: list[str], port: int):
    args = [str(port) if arg == "PORT" else arg for arg in command]
    return run_client(args, cluster.workdir, timeout=ANSWER_SECONDS)


def dashboard_port(cluster) -> int:
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    return int(coordinator.wait_for(r"dashboard at http://127\.0\.0\.1:(\d+)/").group(1))


@pytest.mark.parametrize("command", [TRAIN, STATUS], ids=["train", "status"])
def test_the_client_pointed_at_the_dashboard_says_it_is_an_http_server(cluster, command):
    done = client_at(cluster, command, dashboard_port(cluster))
    assert done.returncode == 1
    assert "is an HTTP server, not the coordinator's Thrift port" in done.stderr
    assert "max-frame-mb" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [TRAIN, STATUS, RUNS], ids=["train", "status", "runs"])
def test_the_client_pointed_at_a_compute_node_says_it_is_one(cluster, command):
    done = client_at(cluster, command, cluster.add_node(0.0).port)
    assert done.returncode == 1
    assert "is a compute node, not a coordinator" in done.stderr
    assert "Unknown function" not in done.stderr and "resume" not in done.stderr


def test_an_http_request_on_a_thrift_port_is_told_and_logged_as_such(cluster):
    node = cluster.add_node(0.0)
    with socket.create_connection(("127.0.0.1", node.port), timeout=ANSWER_SECONDS) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(4096), b"")).decode()
    assert answer.startswith("HTTP/1.0 400")
    assert "speaks Thrift, not HTTP" in answer
    line = node.wait_for(r".*sent an HTTP request.*").group(0)
    assert "WARNING" in line and "max-frame-mb" not in line
