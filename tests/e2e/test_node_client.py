"""The Node.js example (examples/node) trains through a real coordinator with the stock
Thrift library, and reads the refusal of a TLS-only coordinator.

Needs node, npm and the thrift compiler; the first run installs the example's pinned
packages into examples/node/node_modules (git-ignored) with `npm ci`, later runs reuse them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.local_cluster import REPO
from tests.conftest import Cluster
from tests.tls_certs import Certs, make_certs
from training.model_file import load_model

EXAMPLE = REPO / "examples" / "node"
# The README's compat figures: the validation error after round 1 and 2 of this run.
COMPAT_RUN = ["--rounds", "2", "--config",
              json.dumps({"epochs": 15, "hidden": [20], "eta": 0.0001, "compat": True})]
COMPAT_ERRORS = ["0.9574", "0.9277"]
INSTALL_SECONDS = 180.0
TOKEN = "node-example-token-5678"


def _missing_tools() -> list[str]:
    return [tool for tool in ("node", "npm", "thrift") if shutil.which(tool) is None]


pytestmark = pytest.mark.skipif(bool(_missing_tools()),
                                reason=f"needs {', '.join(_missing_tools())} on PATH")


@pytest.fixture(scope="module")
def example() -> Path:
    """examples/node with its packages installed and its code generated from the IDL."""
    if not (EXAMPLE / "node_modules" / "thrift" / "package.json").exists():
        start = time.monotonic()
        npm("ci", "--no-audit", "--no-fund", timeout=INSTALL_SECONDS)
        print(f"npm ci took {time.monotonic() - start:.1f} s")
    npm("run", "gen")
    return EXAMPLE


def npm(*args: str, timeout: float = 60.0) -> None:
    done = subprocess.run(["npm", *args], cwd=EXAMPLE, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"npm {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def train_js(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(["node", str(EXAMPLE / "train.js"), *args], cwd=EXAMPLE,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def client_flags(cluster: Cluster, certs: Certs) -> list[str]:
    return ["--token-file", str(cluster.workdir / "trainer.token"), "--tls-ca", str(certs.ca)]


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    """Two idle nodes and a coordinator, all serving TLS only and requiring the token."""
    cluster = Cluster(tmp_path_factory.mktemp("node-client"))
    (cluster.workdir / "trainer.token").write_text(TOKEN + "\n")
    flags = [*client_flags(cluster, certs), "--tls-cert", str(certs.cert),
             "--tls-key", str(certs.key)]
    try:
        for _ in range(2):
            cluster.add_node(0.0, *flags)
        cluster.start_coordinator(2, *flags)
        yield cluster
    finally:
        cluster.stop()


def test_the_node_example_trains_and_prints_the_final_metrics(
        example: Path, secure_cluster: Cluster, certs: Certs) -> None:
    port = str(secure_cluster.coordinator.port)
    done = train_js("127.0.0.1", port, *COMPAT_RUN, *client_flags(secure_cluster, certs))
    assert done.returncode == 0, done.stderr + secure_cluster.logs()
    out = done.stdout
    assert f"Final validation error: {COMPAT_ERRORS[-1]}" in out, out  # as the Python client
    history = re.findall(r"^\s+(\d+)\s+(\d\.\d{4})\s", out, re.MULTILINE)
    assert history == [(str(i + 1), e) for i, e in enumerate(COMPAT_ERRORS)], out
    accepted = re.findall(r"^127\.0\.0\.1:\d+\s+(\d+)\s", out, re.MULTILINE)
    assert len(accepted) == 2 and sum(map(int, accepted)) >= 22, out  # 11 units a round
    run_id = re.search(r"Run: (\w+)", out).group(1)
    saved, _ = load_model(secure_cluster.workdir / "runs" / run_id / "model.npz")
    decoded = re.findall(r"^weights (\S+) (\w+) \[([\d, ]*)\] mean \|w\| (\S+)$", out,
                         re.MULTILINE)
    assert decoded == [(name, str(w.dtype), ", ".join(map(str, w.shape)),
                        f"{np.abs(w).mean():.4g}") for name, w in saved.items()], out


def test_the_node_client_reads_a_tls_coordinators_refusal(
        example: Path, secure_cluster: Cluster) -> None:
    start = time.monotonic()
    done = train_js("127.0.0.1", str(secure_cluster.coordinator.port))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "only TLS connections" in done.stderr and "--tls-ca" in done.stderr, done.stderr
    assert "unknown RPC" not in done.stderr
    assert time.monotonic() - start < 5.0  # answered at once, not after a timeout
    secure_cluster.coordinator.wait_for("does not speak TLS")


def test_bad_arguments_exit_2_with_the_usage(example: Path) -> None:
    done = train_js("127.0.0.1")
    assert done.returncode == 2 and "usage: node train.js" in done.stderr
    done = train_js("127.0.0.1", "1", "--config", "[1]")
    assert done.returncode == 2 and "expected a JSON object" in done.stderr
