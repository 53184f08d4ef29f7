"""The client examples train through a real coordinator with stock Thrift libraries.

examples/node (Node.js, the `thrift` npm package) and examples/python (the `thrift`
package and gen-py only) run against one cluster whose two processes require a token and
serve TLS only; both examples also read the refusal the coordinator sends a client that
dials it without TLS.

The Node.js tests need node, npm and the thrift compiler; the first run installs the
example's pinned packages into examples/node/node_modules (git-ignored) with `npm ci`,
later runs reuse them.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.local_cluster import REPO
from tests.conftest import Cluster
from tests.programs import missing_commands, require
from tests.tls_certs import Certs, make_certs
from thrift_trainer.training.outputs.model_file import load_model
from thrift_trainer.wire.tensor_codec import ALLOWED_DTYPES, to_wire

NODE_EXAMPLE = REPO / "examples" / "node"
PYTHON_EXAMPLE = REPO / "examples" / "python" / "train.py"
# The README's compat run: its validation error after rounds 1 and 2, as the Python
# client gets it.
COMPAT_CONFIG = ["--config", json.dumps({"epochs": 15, "hidden": [20], "eta": 0.0001,
                                         "compat": True})]
COMPAT_ERRORS = ["0.9574", "0.9277"]
TRAINING_ROWS = 11 * 1500  # a letters round: 11 units of 1,500 rows
INSTALL_SECONDS = 180.0
TOKEN = "example-token-5678"
WEIGHTS_LINE = re.compile(r"^weights (\S+) (\w+) \[([\d, ]*)\] mean \|w\| (\S+)$", re.MULTILINE)



@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    """An idle node and a coordinator, both serving TLS only and requiring the token."""
    cluster = Cluster(tmp_path_factory.mktemp("client-examples"))
    (cluster.workdir / "trainer.token").write_text(TOKEN + "\n")
    flags = [*client_flags(cluster, certs), "--tls-cert", str(certs.cert),
             "--tls-key", str(certs.key)]
    try:
        cluster.add_node(0.0, *flags)
        cluster.start_coordinator(2, *flags)
        yield cluster
    finally:
        cluster.stop()


def client_flags(cluster: Cluster, certs: Certs) -> list[str]:
    return ["--token-file", str(cluster.workdir / "trainer.token"), "--tls-ca", str(certs.ca)]


@pytest.fixture(scope="module")
def node_example() -> Path:
    """examples/node with its packages installed and its code generated from the IDL."""
    require(missing_commands("node", "npm", "thrift"),
            "apt-get install nodejs npm thrift-compiler; scripts/setup.sh installs them")
    if not (NODE_EXAMPLE / "node_modules" / "thrift" / "package.json").exists():
        start = time.monotonic()
        npm("ci", "--no-audit", "--no-fund", timeout=INSTALL_SECONDS)
        print(f"npm ci took {time.monotonic() - start:.1f} s")
    npm("run", "gen")
    return NODE_EXAMPLE


def npm(*args: str, timeout: float = 60.0) -> None:
    done = subprocess.run(["npm", *args], cwd=NODE_EXAMPLE, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"npm {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def run_example(language: str, *args: str) -> subprocess.CompletedProcess:
    command = (["node", str(NODE_EXAMPLE / "train.js")] if language == "node"
               else [sys.executable, str(PYTHON_EXAMPLE)])
    return subprocess.run([*command, *args], cwd=REPO / "examples", capture_output=True,
                          text=True, timeout=60)


def check_final_metrics(out: str, cluster: Cluster, rounds: int) -> None:
    """The output holds the run's final error and the final weights as the coordinator
    saved them, decoded from their wire bytes."""
    assert f"Final validation error: {COMPAT_ERRORS[rounds - 1]}" in out, out
    run_id = re.search(r"Run: (\w+)", out).group(1)
    saved, _ = load_model(cluster.workdir / "runs" / run_id / "model.npz")
    assert WEIGHTS_LINE.findall(out) == [
        (name, str(w.dtype), ", ".join(map(str, w.shape)), f"{np.abs(w).mean():.4g}")
        for name, w in saved.items()], out


def test_the_node_example_trains_and_prints_the_final_metrics(
        node_example: Path, secure_cluster: Cluster, certs: Certs) -> None:
    done = run_example("node", "127.0.0.1", str(secure_cluster.coordinator.port), "--rounds", "2",
                       *COMPAT_CONFIG, *client_flags(secure_cluster, certs))
    assert done.returncode == 0, done.stderr + secure_cluster.logs()
    check_final_metrics(done.stdout, secure_cluster, rounds=2)
    history = re.findall(r"^\s+(\d+)\s+(\d\.\d{4})\s", done.stdout, re.MULTILINE)
    assert history == [(str(i + 1), e) for i, e in enumerate(COMPAT_ERRORS)], done.stdout
    node = secure_cluster.nodes[0].port
    counts = re.search(rf"^127\.0\.0\.1:{node}\s+(\d+)\s+0\s+0\s+(\d+)$", done.stdout,
                       re.MULTILINE)
    assert counts and int(counts.group(1)) >= 22, done.stdout  # 11 units a round
    assert int(counts.group(2)) >= 2 * TRAINING_ROWS, done.stdout  # each round's rows


def test_the_plain_python_example_trains_and_prints_the_final_metrics(
        secure_cluster: Cluster, certs: Certs) -> None:
    done = run_example("python", "127.0.0.1", str(secure_cluster.coordinator.port),
                       "--rounds", "1", *COMPAT_CONFIG, *client_flags(secure_cluster, certs))
    assert done.returncode == 0, done.stderr + secure_cluster.logs()
    check_final_metrics(done.stdout, secure_cluster, rounds=1)
    node = secure_cluster.nodes[0].port
    samples = re.search(rf"^127\.0\.0\.1:{node} .* samples (\d+)$", done.stdout, re.MULTILINE)
    assert samples and int(samples.group(1)) >= TRAINING_ROWS, done.stdout


@pytest.mark.parametrize("language", ["node", "python"])
def test_an_example_reads_the_refusal_of_a_tls_coordinator(
        request: pytest.FixtureRequest, secure_cluster: Cluster, language: str) -> None:
    if language == "node":
        request.getfixturevalue("node_example")
    start = time.monotonic()
    done = run_example(language, "127.0.0.1", str(secure_cluster.coordinator.port))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "only TLS connections" in done.stderr and "--tls-ca" in done.stderr, done.stderr
    assert "unknown RPC" not in done.stderr
    assert time.monotonic() - start < 5.0  # answered at once, not after a timeout
    secure_cluster.coordinator.wait_for("does not speak TLS")


def test_the_node_example_exits_2_on_bad_arguments(node_example: Path) -> None:
    done = run_example("node", "127.0.0.1")
    assert done.returncode == 2 and "usage: node train.js" in done.stderr
    done = run_example("node", "127.0.0.1", "1", "--config", "[1]")
    assert done.returncode == 2 and "expected a JSON object" in done.stderr


def test_the_node_example_decodes_every_dtype_the_wire_carries(node_example: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {dtype: (rng.standard_normal((2, 3)) * 50).astype(dtype)
              for dtype in sorted(ALLOWED_DTYPES)}
    arrays["scalar"] = np.array(2.5, dtype=np.float32)
    arrays["big-endian"] = np.arange(6, dtype=">i4").reshape(3, 2)  # sent little-endian
    sent = [to_wire(name, array) for name, array in arrays.items()]
    payload = [{"name": t.name, "dtype": t.dtype, "shape": t.shape,
                "data": base64.b64encode(bytes(t.data)).decode()} for t in sent]
    script = ("const {decodeTensor} = require('./train.js');"
              "const sent = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(sent.map((t) => {"
              "  const d = decodeTensor({...t, data: Buffer.from(t.data, 'base64')});"
              "  return [d.shape, Array.from(d.values)]; })));")
    done = subprocess.run(["node", "-e", script], input=json.dumps(payload), cwd=NODE_EXAMPLE,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    decoded = json.loads(done.stdout)
    for (shape, values), (name, array) in zip(decoded, arrays.items(), strict=True):
        assert shape == list(array.shape), name
        assert values == array.astype(np.float64).ravel().tolist(), name
