"""Pings asking a real node process to warm up: a name it cannot build, however long, is
refused with a folded log line and leaves nothing behind (VmRSS says so), while the warm-up
a coordinator asks for still runs. Attackers call from 127.0.0.2 (tests/hostile.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.local_cluster import REPO, Proc, python_env
from tests.conftest import Cluster
from tests.hostile import AttackerClient, resident_bytes
from tests.waiting import wait_until
from thrift_trainer.training.models.names import BUILT_IN_MODELS
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.rpc import connect

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

MIB = 1024 * 1024
HOST = "127.0.0.1"
WARM_SECONDS = 180.0  # torch's first import and a model's build on a loaded machine
LONG_NAMES, LONG_NAME_BYTES = 32, 4 * MIB
GROWTH_LIMIT = 48 * MIB  # receive buffers kept for reuse (32 MiB) and the allocator's slack


def ping(port: int, warm_up: str | None = None) -> ttypes.NodeInfo:
    with connect(ComputeNode.Client, HOST, port, read_timeout=30.0) as client:
        return client.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION,
                                              warm_up=warm_up))


def warm(node: Proc, model: str) -> None:
    """Ask for a warm-up as a coordinator does, and wait until the node says it is done."""
    ping(node.port, model)
    assert wait_until(lambda: not ping(node.port).warming_up, WARM_SECONDS), node.log()
    node.wait_for(rf"warmed up for {model} in")


def test_warm_up_names_a_node_cannot_build_are_refused_and_not_kept(cluster: Cluster) -> None:
    node = cluster.add_node(0.0)
    warm(node, "mlpgan28-tiny")  # torch imported and a model built: not counted below
    before = resident_bytes(node)
    warming = []
    for index in range(LONG_NAMES):  # each on a connection of its own, closed after
        with AttackerClient(ComputeNode, node.port) as client:
            name = f"{index:02d}" + "m" * LONG_NAME_BYTES
            warming.append(client.ping(ttypes.PingRequest(
                protocol_version=PROTOCOL_VERSION, warm_up=name)).warming_up)
    with AttackerClient(ComputeNode, node.port) as client:
        for index in range(200):
            for name in (f"no_such_model_{index}", f"evil_{index}:Net", "mlpgan28-tiny:x"):
                warming.append(client.ping(ttypes.PingRequest(
                    protocol_version=PROTOCOL_VERSION, warm_up=name)).warming_up)

    def grown() -> int:
        return resident_bytes(node) - before

    assert wait_until(lambda: grown() < GROWTH_LIMIT, 15.0), \
        f"the node holds {grown() / MIB:.0f} MiB more after {LONG_NAMES} pings asking to " \
        f"warm up for names of {LONG_NAME_BYTES // MIB} MiB"
    assert not any(warming), "a name the node cannot build was warmed up for"
    refusals = [line for line in node.lines if "for a model it cannot build, refused" in line]
    assert 1 <= len(refusals) <= 5, refusals[:3]  # folded: one line, then counts
    assert max(len(line) for line in node.lines) < 1000, "a warm-up name was logged whole"

    warm(node, "dcgan28-tiny")  # the warm-up a coordinator asks for still runs
    assert ping(node.port).node_id


def test_a_node_started_to_warm_up_for_a_model_it_cannot_build_exits_2_with_one_line(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "compute_node.py"), "0", "0", "--host", HOST,
         "--warm-up", "dcgan29"], cwd=tmp_path, env=python_env(), capture_output=True,
        text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --warm-up: unknown model 'dcgan29'; known: " + ", ".join(BUILT_IN_MODELS)
        + ", or a plug-in module:attribute (e.g. my_models:SmallCNN)"), done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout
