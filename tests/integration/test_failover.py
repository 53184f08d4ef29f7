"""Coordinators sharing a PostgreSQL run store: one leads, the others stand by and take
its runs over when it dies; a paused leader is fenced; clients follow the leader.
Real coordinator, node and client processes, and a real PostgreSQL server."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import psycopg
import pytest

from devtools import local_cluster as procs
from devtools.ledger_audit import RunShape, audit
from tests.e2e.test_federated_clients import FEDERATED
from tests.e2e.test_secure_rounds import _fixed_sampling_epsilons
from thrift_trainer.coordinator.drills import DIES_AT_VARIABLE
from thrift_trainer.coordinator.postgres_store import PostgresRunStore
from thrift_trainer.training.outputs.model_file import load_model

ROUNDS = 6
# Server momentum keeps state between rounds: a takeover that lost it would change the bits.
TRAIN = ["letters", str(ROUNDS), "2", "16", "0.01", "--local-optimizer", "sgd",
         "--server-optimizer", "momentum"]
ASYNC_TRAIN = ["--config", str(procs.REPO / "configs" / "letters_async.yaml"), "--set",
               f"run.rounds={ROUNDS}", "--set", "delta_avg.epochs=1"]
LEASE = "2"  # seconds: takeovers within a few seconds keep the tests short
# Central DP (docs/privacy.md): 4 of 12 clients a round, noised at 1.1 x a clip of 0.5.
PRIVATE_TRAIN = [*FEDERATED, "--set", f"run.rounds={ROUNDS}", "--set", "privacy.clip=0.5",
                 "--set", "privacy.noise_multiplier=1.1", "--set", "privacy.delta=0.001"]


class Pair:
    """Two nodes and two coordinators (a and b, a started first, so it leads) on one
    PostgreSQL database, each coordinator with a run folder of its own, as on two
    machines. ``slow``: every unit waits 0.2 s first (policy 1, load 1), so that rounds
    last a second or two."""

    def __init__(self, workdir: Path, url: str, slow: bool = False,
                 dies_at: str | None = None, deterministic: bool = True,
                 clients: tuple[str, str] | None = None) -> None:
        """``clients``: the federated clients each node holds (``--clients``)."""
        self.workdir, self.url = workdir, url
        self.deterministic = deterministic
        self.policy = 1 if slow else 2
        load = ["1.0", "--load-delay", "0.2"] if slow else ["0.0"]
        held = [["--clients", c] for c in clients] if clients else [[], []]
        self.nodes = [procs.start("compute_node.py", ["0", *load, "--host", "127.0.0.1",
                                                      "--seed", str(i), *held[i - 1]],
                                  workdir, f"node{i}")
                      for i in (1, 2)]
        self.nodes_file = procs.write_nodes_file(workdir / "compute_nodes.txt", self.nodes)
        self.a = self.coordinator("a", dies_at=dies_at)
        self.a.wait_for("leading: this coordinator leads")
        self.b = self.coordinator("b")
        self.b.wait_for(f"standing by: 127.0.0.1:{self.a.port} leads")

    def coordinator(self, name: str, *extra: str, dies_at: str | None = None) -> procs.Proc:
        """``dies_at``: POINT:ROUND where it SIGKILLs itself (coordinator/drills.py)."""
        env = {**procs.python_env(), **({DIES_AT_VARIABLE: dies_at} if dies_at else {})}
        return procs.start_coordinator(self.workdir, self.nodes_file, self.policy, "--store",
                                       self.url, *["--deterministic"] * self.deterministic,
                                       "--lease", LEASE, *extra,
                                       run_dir=self.workdir / f"runs-{name}",
                                       name=f"coordinator-{name}", env=env)

    def hosts_and_ports(self) -> list[str]:
        return ["127.0.0.1,127.0.0.1", f"{self.a.port},{self.b.port}"]

    def start_client(self, run_id: str, train: list[str] = TRAIN) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(procs.REPO / "client.py"), *self.hosts_and_ports(), *train,
             "--run-id", run_id, "--json", "--poll", "0.2"], cwd=self.workdir,
            env=procs.python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()}" for p in [*self.nodes, self.a,
                                                                       self.b])

    def stop(self) -> None:
        for proc in [self.a, self.b, *self.nodes]:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGCONT)  # a paused one must hear the SIGTERM
            proc.stop()


@pytest.fixture
def pair(tmp_path: Path, postgres_url: str):
    made = Pair(tmp_path, postgres_url)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The same run, on one coordinator with the SQLite store, never interrupted."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    nodes = [procs.start_node(workdir, f"node{i}", 0.0, "--seed", str(i)) for i in (1, 2)]
    coordinator = procs.start_coordinator(
        workdir, procs.write_nodes_file(workdir / "compute_nodes.txt", nodes), 2,
        "--deterministic")
    try:
        done = procs.run_client(["127.0.0.1", str(coordinator.port), *TRAIN, "--run-id",
                                 "same", "--json"], workdir)
        assert done.returncode == 0, done.stderr
    finally:
        for proc in [coordinator, *nodes]:
            proc.stop()
    return load_model(workdir / "models" / "same.npz")[0]


def _finish(pair: Pair, client: subprocess.Popen) -> tuple[dict, str]:
    try:
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + pair.logs()
    return json.loads(out), err


def _same_weights(pair: Pair, run_id: str, expected: dict[str, np.ndarray]) -> bool:
    weights = load_model(pair.workdir / "models" / f"{run_id}.npz")[0]
    return weights.keys() == expected.keys() and all(
        np.array_equal(weights[k], expected[k]) for k in expected)


@pytest.mark.parametrize("moment", [
    r"run same: delta_avg",  # before the first checkpoint
    r"round 3/6",  # mid-run, after a checkpoint
])
def test_a_killed_leader_s_run_ends_at_the_standby_with_the_same_bits(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray],
        moment: str) -> None:
    pair = Pair(tmp_path, postgres_url, slow=True)  # the kill lands before the run's end
    try:
        _killed_mid_run(pair, uninterrupted, moment)
    finally:
        pair.stop()


def _killed_mid_run(pair: Pair, uninterrupted: dict[str, np.ndarray], moment: str) -> None:
    client = pair.start_client("same")
    pair.a.wait_for(moment, timeout=60)
    pair.a.popen.kill()
    result, err = _finish(pair, client)
    assert result["rounds"] == ROUNDS
    # the units of the rounds before the takeover, and those it took up, count as done
    assert result["units"]["done"] == result["units"]["total"], result["units"]
    assert result["coordinator_run_dir"].startswith(str(pair.workdir / "runs-b"))
    pair.b.wait_for(r"leading the run store .* \(epoch 2\)")
    pair.b.wait_for("run same taken over from the previous leader")
    assert _same_weights(pair, "same", uninterrupted)
    with psycopg.connect(pair.url) as db:  # every unit accounted for, none open
        open_attempts = db.execute("SELECT count(*) FROM attempts WHERE status = "
                                   "'in_progress'").fetchone()[0]
        completed = db.execute("SELECT count(*) FROM (SELECT 1 FROM attempts WHERE status = "
                               "'completed' GROUP BY round, unit_id HAVING count(*) > 1) t"
                               ).fetchone()[0]
    assert (open_attempts, completed) == (0, 0)


@pytest.mark.parametrize(("dies_at", "resumes_after"), [
    ("aggregate:2", 1),  # round 2's results in, the update not applied: round 2 again
    ("checkpoint:3", 2),  # round 3's checkpoint half written to the store: not there
])
def test_a_leader_dying_mid_aggregation_or_mid_checkpoint_write_loses_nothing(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray],
        dies_at: str, resumes_after: int) -> None:
    pair = Pair(tmp_path, postgres_url, dies_at=dies_at)
    try:
        client = pair.start_client("same")
        assert pair.a.popen.wait(60) == -signal.SIGKILL
        result, _ = _finish(pair, client)
        pair.b.wait_for(f"run same resumes after round {resumes_after} ")
        assert result["rounds"] == ROUNDS and _same_weights(pair, "same", uninterrupted)
        with psycopg.connect(pair.url) as db:
            parts = db.execute("SELECT count(*) FROM run_files WHERE name = "
                               "'checkpoint.npz'").fetchone()[0]
            units, redone = db.execute(
                "SELECT count(DISTINCT unit_id), count(DISTINCT unit_id) FILTER (WHERE started "
                ">= (SELECT min(time) FROM unit_events WHERE round = %s AND reason LIKE "
                "'reopened%%')) FROM attempts WHERE round = %s", (resumes_after + 1,) * 2
            ).fetchone()
            left = db.execute("SELECT count(*) FROM kept_results").fetchone()[0]
        assert parts == 1 and left == 0  # the run's end let go of every kept result
        # the round the new leader resumed with took up the results the old one had kept
        # (all of them when the round had ended and its checkpoint was being written) and
        # computed only the other units again
        taken = re.search(rf"round {resumes_after + 1} takes up (\d+) results kept",
                          pair.b.log())
        assert taken is not None and int(taken[1]) >= 1, pair.logs()
        assert int(taken[1]) + redone == units, (taken[0], units, redone)
        if dies_at.startswith("checkpoint"):
            assert redone == 0
    finally:
        pair.stop()


def test_a_leader_dying_in_round_1_s_aggregation_has_every_unit_of_round_1_computed_again(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray]) -> None:
    """No checkpoint precedes round 1, so none of its results is kept: the new leader
    resumes after round 0, reopens every unit of round 1, takes up none and computes each
    again, once, and the run ends with the bits of a run never interrupted."""
    pair = Pair(tmp_path, postgres_url, dies_at="aggregate:1")
    try:
        client = pair.start_client("same")
        assert pair.a.popen.wait(60) == -signal.SIGKILL
        result, _ = _finish(pair, client)
        resumed = pair.b.wait_for(r"run same resumes after round 0 \((\d+) units reopened\)")
        assert result["rounds"] == ROUNDS and _same_weights(pair, "same", uninterrupted)
        with psycopg.connect(pair.url) as db:
            units, completed, redone, lost = db.execute(
                "SELECT count(DISTINCT unit_id), count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE status = 'completed' AND started >= (SELECT min(time) "
                "FROM unit_events WHERE round = 1 AND reason LIKE 'reopened%%')), count(*) "
                "FILTER (WHERE status = 'stale' AND reason LIKE 'its result was lost%%') FROM "
                "attempts WHERE round = 1").fetchone()
            attempts = db.execute("SELECT unit_id, attempt, status, reason FROM attempts WHERE "
                                  "round = 1 ORDER BY unit_id, attempt").fetchall()
        # every unit reopened and completed once, by the new leader; the results the old
        # one had were lost with it
        assert (int(resumed[1]), completed, redone) == (units, units, units) and lost >= 1, (
            resumed[0], units, completed, redone, lost, attempts)
        log = pair.b.log()
        assert "takes up" not in log and "run store refused" not in log, log
    finally:
        pair.stop()


def test_a_private_run_taken_over_mid_checkpoint_reports_each_round_once_as_charged(
        tmp_path: Path, postgres_url: str) -> None:
    """Central DP: the leader dies inside round 3's checkpoint, round 3 charged and
    recorded, its weights not yet out. The standby takes over, forgets round 3's row but
    not its charge, and computes the round again with the same noise: charged once, as
    nothing of the first computation left. Every round is reported once with
    dp-accounting's epsilon, and the store never charged fewer releases than that."""
    pair = Pair(tmp_path, postgres_url, dies_at="checkpoint:3", clients=("0-5", "6-11"))
    try:
        client = pair.start_client("private", PRIVATE_TRAIN)
        assert pair.a.popen.wait(60) == -signal.SIGKILL
        with psycopg.connect(pair.url) as db:  # the leader's charges, read before takeover
            charged_then = [r for (r,) in db.execute(
                "SELECT round FROM privacy_charges ORDER BY charge")]
        result, _ = _finish(pair, client)
        pair.b.wait_for("run private resumes after round 2 ")
        run_dir = Path(result["coordinator_run_dir"])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
                .splitlines()]
        with psycopg.connect(pair.url) as db:
            charges = db.execute("SELECT round, epsilon FROM privacy_charges WHERE run_id = "
                                 "'private' ORDER BY charge").fetchall()
        expected = _fixed_sampling_epsilons(ROUNDS)
        assert charged_then == [1, 2, 3], charged_then
        assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
        assert [row["epsilon"] for row in rows] == pytest.approx(expected, rel=5e-4)
        assert [r for r, _ in charges] == list(range(1, ROUNDS + 1))
        assert [e for _, e in charges] == [row["epsilon"] for row in rows]
        status = procs.run_client(["status", "127.0.0.1", str(pair.b.port), "private",
                                   "--json"], pair.workdir)
        assert json.loads(status.stdout)["clients"]["epsilon"] == rows[-1]["epsilon"]
    finally:
        pair.stop()


def test_an_asynchronous_run_s_new_leader_keeps_again_what_its_round_had_kept(
        tmp_path: Path, postgres_url: str) -> None:
    """Killed inside round 3's checkpoint: round 3's results, all kept, are kept again by
    the new leader in their order (their versions made again: round 3 ends with the model
    the old leader had evaluated) and none is computed again; the ledger audit holds."""
    pair = Pair(tmp_path, postgres_url, dies_at="checkpoint:3", deterministic=False)
    try:
        client = pair.start_client("stream", ASYNC_TRAIN)
        assert pair.a.popen.wait(60) == -signal.SIGKILL
        result, _ = _finish(pair, client)
        pair.b.wait_for("run stream resumes after round 2 ")
        taken = re.search(r"round 3 takes up (\d+) results kept", pair.b.log())
        with psycopg.connect(pair.url) as db:
            per_round, redone = db.execute(
                "SELECT (SELECT completed_units FROM rounds WHERE round = 3), count(*) FROM "
                "attempts WHERE status = 'stale' AND reason LIKE 'its result was lost%%'"
            ).fetchone()
        ledger = audit(pair.url, "stream", RunShape(ROUNDS, per_round, "async"))
        assert result["rounds"] == ROUNDS and ledger.ok, [c for c in ledger.checks if not c.ok]
        assert taken is not None and (int(taken[1]), redone) == (per_round, 0), pair.logs()
        # round 3 made again from the same results in the same order: the same model
        assert _round_line(pair.a, 3) == _round_line(pair.b, 3) is not None
    finally:
        pair.stop()


def _round_line(coordinator: procs.Proc, round_index: int) -> str | None:
    """The validation error a coordinator logged for a round."""
    found = re.search(rf"round {round_index}/\d+: validation error (\S+)", coordinator.log())
    return None if found is None else found[1]


def test_a_paused_leader_is_fenced_and_steps_down(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray]) -> None:
    pair = Pair(tmp_path, postgres_url, slow=True)
    try:
        client = pair.start_client("same")
        pair.a.wait_for(r"round 2/6", timeout=60)
        pair.a.popen.send_signal(signal.SIGSTOP)
        pair.b.wait_for("run same taken over", timeout=30)
        pair.a.popen.send_signal(signal.SIGCONT)  # it wakes believing it leads
        pair.a.wait_for(r"stepped down: the lease of epoch 1 is lost, "
                        rf"127.0.0.1:{pair.b.port} leads now \(epoch 2\)", timeout=30)
        result, _ = _finish(pair, client)
        assert result["coordinator_run_dir"].startswith(str(pair.workdir / "runs-b"))
        assert _same_weights(pair, "same", uninterrupted)
        status = procs.run_client(["status", "127.0.0.1", str(pair.a.port), "same", "--json"],
                                  tmp_path)
        assert json.loads(status.stdout)["leader"] == f"127.0.0.1:{pair.b.port}", pair.logs()
    finally:
        pair.stop()


def test_a_standby_serves_status_and_refuses_training(pair: Pair) -> None:
    runs = procs.run_client(["runs", "127.0.0.1", str(pair.b.port)], pair.workdir)
    assert runs.returncode == 0, runs.stderr
    train = procs.run_client(["127.0.0.1", str(pair.b.port), *TRAIN, "--run-id", "r"],
                             pair.workdir)
    assert train.returncode == 1
    assert f"this coordinator stands by (127.0.0.1:{pair.a.port} leads)" in train.stderr
    both = procs.run_client([*pair.hosts_and_ports(), *TRAIN, "--run-id", "r", "--json"],
                            pair.workdir)  # given both, the client finds the leader
    assert both.returncode == 0, both.stderr
    status = procs.run_client(["status", "127.0.0.1", str(pair.b.port), "r", "--json"],
                              pair.workdir)
    shown = json.loads(status.stdout)
    assert (shown["state"], shown["leader"]) == ("completed", f"127.0.0.1:{pair.a.port}")
    third = pair.coordinator("c", "--dashboard-port", "0", "--dashboard-host", "127.0.0.1")
    try:
        url = third.wait_for(r"dashboard at (http://\S+)").group(1).rstrip("/")
        with urllib.request.urlopen(f"{url}/api/runs", timeout=10) as answer:
            page = json.loads(answer.read())
        assert page["leader"] == f"127.0.0.1:{pair.a.port} leads"
        assert [r["run_id"] for r in page["runs"]] == ["r"]  # read from the store
    finally:
        third.stop()


def test_a_restarted_database_pauses_the_run_which_then_ends_with_the_same_bits(
        tmp_path: Path, postgres_server, postgres_url: str,
        uninterrupted: dict[str, np.ndarray]) -> None:
    # every unit waits 0.2 s first (policy 1, load 1): the database stops mid-run
    nodes = [procs.start_node(tmp_path, f"node{i}", 1.0, "--seed", str(i), "--load-delay",
                              "0.2") for i in (1, 2)]
    coordinator = procs.start_coordinator(
        tmp_path, procs.write_nodes_file(tmp_path / "compute_nodes.txt", nodes), 1,
        "--store", postgres_url, "--deterministic")
    try:
        client = subprocess.Popen(
            [sys.executable, str(procs.REPO / "client.py"), "127.0.0.1", str(coordinator.port),
             *TRAIN, "--run-id", "same", "--json", "--poll", "0.2"], cwd=tmp_path,
            env=procs.python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        coordinator.wait_for(r"round 2/6", timeout=60)
        postgres_server.stop()
        try:
            coordinator.wait_for("cannot be reached: training pauses", timeout=30)
            status = procs.run_client(["status", "127.0.0.1", str(coordinator.port), "same",
                                       "--json"], tmp_path)
            assert json.loads(status.stdout)["message"].startswith(
                "paused: the run store cannot be reached"), status.stderr
        finally:
            postgres_server.start()
        coordinator.wait_for(r"is back after [\d.]+ s: training goes on", timeout=30)
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err + coordinator.log()
        assert json.loads(out)["rounds"] == ROUNDS
        weights = load_model(tmp_path / "models" / "same.npz")[0]
        assert all(np.array_equal(weights[k], uninterrupted[k]) for k in uninterrupted)
    finally:
        for proc in [coordinator, *nodes]:
            proc.stop()


def test_a_pull_node_works_for_whichever_coordinator_leads(tmp_path: Path,
                                                          postgres_url: str) -> None:
    pair = Pair(tmp_path, postgres_url, slow=True)
    # the standby listed first: its answer to the registration names the leader
    puller = procs.start("compute_node.py", [
        "--pull", f"127.0.0.1:{pair.b.port},127.0.0.1:{pair.a.port}", "0", "--node-id",
        "puller", "--load-delay", "0.2"], pair.workdir, "puller", ready=procs.PULLING)
    try:
        puller.wait_for(f"registered with 127.0.0.1:{pair.a.port} as pull:puller", timeout=30)
        client = pair.start_client("pulled")
        pair.a.wait_for(r"round 2/6", timeout=60)
        pair.a.popen.kill()
        result, _ = _finish(pair, client)
        puller.wait_for(f"registered with 127.0.0.1:{pair.b.port} as pull:puller", timeout=30)
        by_node = {n["node"]: n for n in result["nodes"]}
        assert by_node.get("pull:puller", {}).get("accepted", 0) > 0, pair.logs() + puller.log()
    finally:
        puller.stop()
        pair.stop()


def _coordinator_error(tmp_path: Path, url: str) -> subprocess.CompletedProcess:
    (tmp_path / "nodes.txt").write_text("")
    return subprocess.run([sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2",
                           "--host", "127.0.0.1", "--nodes-file", str(tmp_path / "nodes.txt"),
                           "--store", url], cwd=tmp_path, env=procs.python_env(),
                          capture_output=True, text=True, timeout=60)


def test_a_store_that_cannot_be_used_stops_the_coordinator_with_one_line(
        tmp_path: Path, postgres_url: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    down = _coordinator_error(tmp_path, f"postgresql://trainer:secret@127.0.0.1:{closed}/x")
    assert down.returncode == 1
    assert "error: cannot open the run store: cannot connect to the run store postgresql://" \
           f"trainer:***@127.0.0.1:{closed}/x: connection failed" in down.stderr
    assert "secret" not in down.stdout + down.stderr
    PostgresRunStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = 99")
    newer = _coordinator_error(tmp_path, postgres_url)
    assert newer.returncode == 1
    assert "has run store schema version 99, newer than this coordinator understands" \
        in newer.stderr
