"""Where a coordinator's PostgreSQL run store is: every location libpq accepts (URLs with
several hosts, the key=value form) works, one it refuses stops the coordinator with one
line, and no form of password (in the user info, in the query, in the key=value form, in
PGPASSWORD) is ever printed. Real coordinator processes and a real PostgreSQL server
(which trusts every connection: any password is accepted)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from devtools import local_cluster as procs

SECRET = "Sesame-Open-4711"


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _location(form: str, port: int, database: str) -> tuple[str, dict[str, str]]:
    """The --store argument and the environment of each form of password."""
    env = procs.python_env()
    env.pop("PGPASSWORD", None)
    if form == "user info":
        return f"postgresql://trainer:{SECRET}@127.0.0.1:{port}/{database}", env
    if form == "query":
        return f"postgresql://trainer@127.0.0.1:{port}/{database}?password={SECRET}", env
    if form == "key=value":
        return (f"host=127.0.0.1 port={port} dbname={database} user=trainer "
                f"password={SECRET}"), env
    return f"postgresql://trainer@127.0.0.1:{port}/{database}", {**env, "PGPASSWORD": SECRET}


def _coordinator_error(tmp_path: Path, location: str, env: dict[str, str] | None = None
                       ) -> subprocess.CompletedProcess:
    (tmp_path / "nodes.txt").write_text("")
    return subprocess.run([sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2",
                           "--host", "127.0.0.1", "--nodes-file", str(tmp_path / "nodes.txt"),
                           "--store", location], cwd=tmp_path,
                          env=procs.python_env() if env is None else env,
                          capture_output=True, text=True, timeout=60)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()  # the log's lines first (connection security)
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:] and errors[0].startswith("error: cannot open the run store: "), \
        done.stderr
    return errors[0]


@pytest.mark.parametrize("form", ["user info", "query", "key=value", "PGPASSWORD"])
def test_no_password_is_printed_when_the_store_cannot_be_reached(tmp_path: Path,
                                                                 form: str) -> None:
    location, env = _location(form, _closed_port(), "x")
    done = _coordinator_error(tmp_path, location, env)
    line = _one_error_line(done)
    assert "connection failed" in line or "Connection refused" in line, line
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("form", ["query", "key=value", "PGPASSWORD"])
def test_no_password_is_printed_by_a_coordinator_that_leads(
        tmp_path: Path, postgres_server, postgres_url: str, form: str) -> None:
    location, env = _location(form, postgres_server.port, postgres_url.rsplit("/", 1)[1])
    (tmp_path / "nodes.txt").write_text("")
    coordinator = procs.start_coordinator(
        tmp_path, tmp_path / "nodes.txt", 2, "--store", location, "--dashboard-port", "0",
        "--dashboard-host", "127.0.0.1", env=env)
    try:
        coordinator.wait_for("leading: this coordinator leads", timeout=30)
        coordinator.wait_for(r"leading the run store .* \(epoch \d+\)")
        dashboard = coordinator.wait_for(r"dashboard at (http://\S+)").group(1).rstrip("/")
        with urllib.request.urlopen(f"{dashboard}/api/runs", timeout=10) as answer:
            page = answer.read().decode()
        assert json.loads(page)["runs"] == []
        status = procs.run_client(["status", "127.0.0.1", str(coordinator.port)], tmp_path)
    finally:
        coordinator.stop()
    shown = coordinator.log() + page + status.stdout + status.stderr
    assert SECRET not in shown, shown


@pytest.mark.parametrize("location", [
    f"postgresql://trainer:{SECRET}@127.0.0.1:abc/x",  # a port that is not a number
    f"postgresql://trainer:{SECRET}@127.0.0.1:5432/x?bogus=1",  # no such parameter
    f"postgresql://trainer:ab%zz{SECRET}@127.0.0.1:5432/x",  # a bad percent-encoding
    f"postgresql://trainer:{SECRET}@[::1/x",  # an IPv6 address without its bracket
    f"host=127.0.0.1 password={SECRET} dbname",  # a key without its value
])
def test_a_location_libpq_refuses_stops_the_coordinator_with_one_line(
        tmp_path: Path, location: str) -> None:
    done = _coordinator_error(tmp_path, location)
    _one_error_line(done)
    assert SECRET not in done.stdout + done.stderr


def test_a_url_of_several_hosts_reaches_the_one_that_answers(
        tmp_path: Path, postgres_server, postgres_url: str) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    hosts = f"127.0.0.1:{_closed_port()},127.0.0.1:{postgres_server.port}"
    (tmp_path / "nodes.txt").write_text("")
    coordinator = procs.start_coordinator(
        tmp_path, tmp_path / "nodes.txt", 2, "--store",
        f"postgresql://trainer:{SECRET}@{hosts}/{database}")
    try:
        coordinator.wait_for("leading: this coordinator leads", timeout=30)
        coordinator.wait_for(rf"leading the run store postgresql://trainer:\*\*\*@{hosts}/"
                             f"{database} ")
    finally:
        coordinator.stop()
    assert SECRET not in coordinator.log()
