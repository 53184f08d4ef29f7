"""A shared token and TLS between client, coordinator and nodes, as users run them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.local_cluster import REPO, run_client
from tests.conftest import Cluster
from tests.e2e.test_commands import run_script
from tests.tls_certs import Certs, make_certs
from thrift_trainer.wire import security
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

TOKEN = "e2e-shared-token-1234"
TWO_ROUNDS = ["letters", "2", "15", "20", "0.0001", "--compat"]


@dataclass
class Secure:
    cluster: Cluster
    certs: Certs
    token_file: Path

    def client_flags(self) -> list[str]:
        return ["--token-file", str(self.token_file), "--tls-ca", str(self.certs.ca)]

    def server_flags(self) -> list[str]:
        return [*self.client_flags(), "--tls-cert", str(self.certs.cert),
                "--tls-key", str(self.certs.key)]

    def client(self, *args: str) -> subprocess.CompletedProcess:
        """client.py <coordinator> <port> ARGS: the train command."""
        return run_client(["127.0.0.1", str(self.cluster.coordinator.port), *args],
                          self.cluster.workdir)

    def subcommand(self, name: str, *args: str) -> subprocess.CompletedProcess:
        """client.py NAME <coordinator> <port> ARGS."""
        return run_client([name, "127.0.0.1", str(self.cluster.coordinator.port), *args],
                          self.cluster.workdir)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """Two nodes and a coordinator requiring the token and speaking only TLS."""
    workdir = tmp_path_factory.mktemp("secure")
    token_file = workdir / "trainer.token"
    token_file.write_text(TOKEN + "\n")
    cluster = Cluster(workdir)
    try:
        setup = Secure(cluster, make_certs(workdir / "certs"), token_file)
        for load in (0.2, 0.4):
            cluster.add_node(load, "--load-delay", "0.1", *setup.server_flags())
        cluster.start_coordinator(2, *setup.server_flags())
        yield setup
    finally:
        cluster.stop()


def test_training_runs_end_to_end_over_tls_with_a_token(secure: Secure) -> None:
    result = secure.cluster.train_json(*TWO_ROUNDS, *secure.client_flags())
    assert round(result["validation_error"], 4) == 0.9277  # as without TLS and token
    assert sum(n["accepted"] for n in result["nodes"]) >= 22
    status = secure.subcommand("status", result["run_id"], "--json", *secure.client_flags())
    assert status.returncode == 0, status.stderr
    assert '"completed"' in status.stdout
    for proc in [secure.cluster.coordinator, *secure.cluster.nodes]:
        proc.wait_for("connection security: token required, TLS serving on, TLS to peers on")


@pytest.mark.parametrize("token, refusal", [(None, "carried none"), ("wrong", "does not match")])
def test_a_client_without_the_right_token_is_refused_in_one_line(
    secure: Secure, tmp_path: Path, token: str | None, refusal: str
) -> None:
    flags = ["--tls-ca", str(secure.certs.ca)]
    if token is not None:
        (tmp_path / "token").write_text(token)
        flags += ["--token-file", str(tmp_path / "token")]
    done = secure.client(*TWO_ROUNDS, "--quiet", *flags)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert refusal in done.stderr and "--token-file" in done.stderr


def test_a_plaintext_client_is_refused_by_the_tls_coordinator(secure: Secure) -> None:
    done = secure.subcommand("runs", "--token-file", str(secure.token_file))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "accepts only TLS connections" in done.stderr and "--tls-ca" in done.stderr
    secure.cluster.coordinator.wait_for("does not speak TLS")


@pytest.mark.parametrize("service_name", ["ComputeNode", "Coordinator"])
def test_both_services_answer_only_the_right_token(secure: Secure, service_name: str) -> None:
    service = {"ComputeNode": ComputeNode, "Coordinator": Coordinator}[service_name]
    proc = secure.cluster.nodes[0] if service is ComputeNode else secure.cluster.coordinator
    tls = security.client_context(str(secure.certs.ca))
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    for token, refusal in [(None, "carried none"), ("wrong", "does not match")]:
        with connect(service.Client, "127.0.0.1", proc.port, tls=tls, token=token) as c, \
                pytest.raises(ttypes.Unauthorized, match=refusal):
            c.ping(ping)
    with connect(service.Client, "127.0.0.1", proc.port, tls=tls, token=TOKEN) as c:
        assert c.ping(ping).protocol_version == PROTOCOL_VERSION


# ------------------------------------------------------------- bad flags
@pytest.mark.parametrize("script, args, message", [
    ("compute_node.py", ["0", "0.1", "--token-file", "{missing}"], "does not exist"),
    ("compute_node.py", ["0", "0.1", "--token-file", "{empty}"], "is empty"),
    ("compute_node.py", ["0", "0.1", "--tls-cert", "{empty}"], "go together"),
    ("coordinator_node.py", ["0", "2", "--tls-cert", "{empty}", "--tls-key", "{empty}"],
     "needs --tls-ca"),
    ("coordinator_node.py", ["0", "2", "--tls-ca", "{missing}"], "does not exist"),
    ("client.py", ["runs", "127.0.0.1", "9", "--token-file", "{empty}"], "is empty"),
    ("client.py", ["127.0.0.1", "9", *TWO_ROUNDS, "--tls-ca", "{empty}"], "cannot load TLS CA"),
])
def test_bad_security_flags_are_one_line_errors(tmp_path: Path, script: str, args: list[str],
                                                message: str) -> None:
    (tmp_path / "empty").write_text("\n")
    files = {"{missing}": str(tmp_path / "missing"), "{empty}": str(tmp_path / "empty")}
    (tmp_path / "nodes.txt").write_text("127.0.0.1,9\n")
    extra = ["--nodes-file", str(tmp_path / "nodes.txt")] if script.startswith("coord") else []
    done = run_script(script, *[files.get(a, a) for a in args], *extra, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1


@pytest.mark.parametrize("script", ["compute_node.py", "coordinator_node.py", "client.py"])
def test_help_documents_the_security_flags(script: str) -> None:
    done = run_script(script, "--help", cwd=REPO)
    assert done.returncode == 0
    for flag in ["--token-file", "--tls-ca", "--max-frame-mb", "TRAINER_TOKEN"]:
        assert flag in done.stdout
    assert ("--tls-cert" in done.stdout) == (script != "client.py")
