"""Secure aggregation (SecAgg+, coordinator/secure_rounds.py) through real processes: a
secure run ends with the model of the same run without it, within the quantisation bound,
with clients on several nodes, and with a client whose node is killed mid-round, whose
masks the other clients' shares take off; a private secure run's coordinator killed after
a round's unmask is charged that round twice."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing

import dp_accounting  # requirements-dev.txt installs it (the privacy extra)
import numpy as np
import pytest

from devtools import local_cluster
from devtools.fedavg_replay import replay as _replay
from tests.e2e.test_federated_clients import (
    CLIENTS,
    FEDERATED,
    RESIDENT,
    SHIPPED,
    SITES_PLUGIN,
    _run_dir,
    _with_sets,
    four_sites,
)
from thrift_trainer.coordinator.checkpoint import noise_key
from thrift_trainer.coordinator.drills import DIES_AT_VARIABLE
from thrift_trainer.training.outputs.model_file import load_model

pytestmark = pytest.mark.processes

ROUNDS = 3
SECURE = ["--set", "secure_aggregation.enabled=true"]
# Per coordinate and round, 32 bits lose at most clients / 2^32 (clip_range 1): far below
# what the three rounds' training moves a weight, and far below a client's share.
BOUND = 1e-6


def _model(cluster, result: dict) -> dict[str, np.ndarray]:
    weights, _ = load_model(_run_dir(cluster, result) / "model.npz")
    return weights


def _clients_by_round(cluster, result: dict) -> dict[int, list[str]]:
    lines = [json.loads(line) for line in
             (_run_dir(cluster, result) / "clients.jsonl").read_text().splitlines()]
    trained: dict[int, list[str]] = {}
    for line in lines:
        if "node" in line:
            trained.setdefault(line["round"], []).append(line["client"])
    return {r: sorted(names) for r, names in trained.items()}


def test_a_secure_run_ends_with_the_plain_runs_model_within_the_quantisation_bound(cluster):
    """Half the clients on a pushed node, half on a pull node (which leases its units,
    the secure steps' among them, over its own connection); a sparse graph of two
    neighbours a client (SecAgg+)."""
    cluster.add_node(0.0, "--clients", "0-5")
    cluster.start_coordinator(2)
    puller = local_cluster.start_pull_node(cluster.workdir, "puller", cluster.coordinator.port,
                                           0.0, "--clients", "6-11")
    cluster.nodes.append(puller)
    rounds = ["--set", f"run.rounds={ROUNDS}"]
    plain = cluster.train_json(*FEDERATED, *rounds)
    secure = cluster.train_json(*FEDERATED, *rounds, *SECURE,
                                "--set", "secure_aggregation.neighbours=2")
    assert _clients_by_round(cluster, secure) == _clients_by_round(cluster, plain)
    drawn = _clients_by_round(cluster, secure)
    assert all(len(names) == 4 for names in drawn.values())
    assert any(int(name[6:]) >= 6 for names in drawn.values() for name in names)  # pulled
    start, end = _model(cluster, plain), _model(cluster, secure)
    for name, value in start.items():
        np.testing.assert_allclose(end[name], value, rtol=0, atol=BOUND, err_msg=name)
    assert max(float(np.abs(end[name] - value).max()) for name, value in start.items()) > 0


def test_a_client_killed_mid_round_leaves_the_model_of_the_run_without_it(cluster):
    """The clinic's node dies as its training unit arrives in round 1: the clinic shared
    its secrets (U2) but sent no masked update (not U3), so the wards' shares of its mask
    key take its masks off their sum; it is gone for rounds 2 and 3."""
    from thrift_trainer.compute_node.faults import CRASH_EXIT_CODE

    roots, _ = four_sites(cluster.workdir)
    cluster.add_node(0.0, "--data-root", str(roots["a"]), *SITES_PLUGIN)
    # its keys and shares units are its first two: it crashes on the third, the training
    doomed = cluster.add_node(0.0, "--data-root", str(roots["b"]), *SITES_PLUGIN,
                              "--crash-after-units", "2")
    cluster.start_coordinator(2, "--data-root", str(roots["coordinator"]), *SITES_PLUGIN)
    result = cluster.train_json(*_with_sets(RESIDENT + [
        "run.dataset=sites:sites", "clients.placement=nodes", f"run.rounds={ROUNDS}",
        "secure_aggregation.enabled=true"]))
    assert doomed.popen.wait(timeout=60) == CRASH_EXIT_CODE
    wards = ["ward-1", "ward-2", "ward-3"]
    assert _clients_by_round(cluster, result) == {r: wards for r in range(1, ROUNDS + 1)}
    lines = [json.loads(line) for line in
             (_run_dir(cluster, result) / "clients.jsonl").read_text().splitlines()]
    clinic = {line["round"]: line.get("failed") or line.get("dropped") for line in lines
              if line["client"] == "clinic"}
    assert set(clinic) == set(range(1, ROUNDS + 1)), lines
    assert "secure aggregation" not in clinic[1], clinic  # lost in training, not before
    expected = _replay(RESIDENT + ["clients.placement=nodes"], ROUNDS,
                       lambda r: [(name, roots["a"] / "sites" / name) for name in wards])
    weights = _model(cluster, result)
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=BOUND, err_msg=name)


def test_a_private_secure_run_takes_the_mean_central_dp_fedavg_takes(cluster):
    """Distributed DP: clipping moves to the clients' nodes and every client counts once.
    With a clip no update reaches and no noise, the secure run's model is central
    DP-FedAvg's over the clients its noise key drew (replayed in one process), within the
    quantisation bound; with noise, a central and a secure run report the same epsilon."""
    from thrift_trainer.training.clients.settings import ClientsSettings

    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    cluster.start_coordinator(2)
    rounds = ["--set", f"run.rounds={ROUNDS}"]
    private = ["privacy.clip=1000000.0", "privacy.noise_multiplier=0.0"]
    shared = ["--set", "secure_aggregation.noise_clients=4"]
    secure = cluster.train_json(*FEDERATED, *rounds, *_with_sets(private), *SECURE, *shared)
    run_dir = _run_dir(cluster, secure)
    key = noise_key(run_dir)
    drawn = _clients_by_round(cluster, secure)
    overrides = [item for item in FEDERATED if item != "--set"]
    clients = ClientsSettings(count=CLIENTS, per_round=4)
    sizes = json.loads((run_dir / "partition.json").read_text())["sizes"]
    held = [name for name, size in zip(clients.names(), sizes, strict=True) if size]
    assert drawn == {r: clients.sampled(r, 1, held, key) for r in range(1, ROUNDS + 1)}
    expected = _replay([*overrides, *private], ROUNDS,
                       lambda r: [(name, SHIPPED) for name in drawn[r]], noise_key=key)
    end = _model(cluster, secure)
    for name, value in expected.items():
        np.testing.assert_allclose(end[name], value, rtol=1e-5, atol=BOUND, err_msg=name)
    noised = _with_sets(["privacy.clip=0.5", "privacy.noise_multiplier=1.1",
                         "privacy.delta=0.001"])
    central = cluster.train_json(*FEDERATED, *rounds, *noised)
    secure = cluster.train_json(*FEDERATED, *rounds, *noised, *SECURE, *shared)
    assert [row["epsilon"] for row in secure["history"]] == \
        [row["epsilon"] for row in central["history"]]
    # the clients' noise is their own: the two runs' models differ, by about the noise
    start, end = _model(cluster, central), _model(cluster, secure)
    assert max(float(np.abs(end[name] - value).max()) for name, value in start.items()) > 0.01


def test_a_secure_run_through_a_relay_ends_with_the_plain_runs_model(cluster):
    """Behind a relay, the relay is its clients' node: it makes and keeps their round
    secrets, has its members compute a unit as in a plain run, and masks their combined
    update."""
    members = [local_cluster.start_node(cluster.workdir, f"member{k}", 0.0, "--clients",
                                        clients) for k, clients in ((0, "0-7"), (1, "4-11"))]
    cluster.nodes += members
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt", members)
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group))
    cluster.nodes.append(relay)
    cluster.start_coordinator(2, nodes=[relay])
    rounds = ["--set", f"run.rounds={ROUNDS}"]
    plain = cluster.train_json(*FEDERATED, *rounds)
    secure = cluster.train_json(*FEDERATED, *rounds, *SECURE)
    assert _clients_by_round(cluster, secure) == _clients_by_round(cluster, plain)
    start, end = _model(cluster, plain), _model(cluster, secure)
    for name, value in start.items():
        np.testing.assert_allclose(end[name], value, rtol=0, atol=BOUND, err_msg=name)


def test_a_secure_run_killed_and_resumed_ends_with_its_replay(cluster):
    """The coordinator is killed in round 3: the resumed run computes that round again
    from fresh secrets (the old ones, left on the nodes, are never asked for), and the
    model equals FedAvg replayed in one process over the clients that trained."""
    from tests.e2e.test_private_runs import _killed_in_round_3_and_resumed

    rounds = 5
    sets = [*FEDERATED, *SECURE, "--set", f"run.rounds={rounds}"]
    run_dir, _, _ = _killed_in_round_3_and_resumed(cluster, sets, rounds)
    lines = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text()
             .splitlines()]

    def clients_of(round_index: int):
        return [(line["client"], SHIPPED) for line in lines
                if line["round"] == round_index and "node" in line]
    assert all(len(clients_of(r)) == 4 for r in range(1, rounds + 1)), lines
    expected = _replay([item for item in FEDERATED if item != "--set"], rounds, clients_of)
    weights, _ = load_model(run_dir / "model.npz")
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=BOUND, err_msg=name)


def _fixed_sampling_epsilons(releases: int, clients: int = 12, per_round: int = 4,
                             multiplier: float = 1.1, delta: float = 0.001) -> list[float]:
    """dp-accounting's epsilon after each of ``releases`` rounds of ``per_round`` of
    ``clients`` drawn without replacement (replace-one: the multiplier is halved)."""
    spent = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    epsilons = []
    for _ in range(releases):
        spent.compose(dp_accounting.SampledWithoutReplacementDpEvent(
            clients, per_round, dp_accounting.GaussianDpEvent(multiplier / 2)))
        epsilons.append(spent.get_epsilon(delta))
    return epsilons


def test_a_private_secure_run_killed_after_an_unmask_is_charged_that_round_twice(cluster):
    """Distributed DP: the coordinator is the party the clients' noise protects against,
    and it can learn round 3's noised sum once the unmask step answered. Killed right after
    (coordinator/drills.py: `aggregate`, before the round is written), it had charged the
    round in the run store first; resumed, it computes round 3 again from fresh secrets and
    fresh client noise and charges it again: epsilon counts R + 1 releases, dp-accounting's
    for R + 1 rounds, in the results, the metrics and the status."""
    rounds = 4
    sets = [*FEDERATED, *SECURE, "--set", f"run.rounds={rounds}",
            "--set", "secure_aggregation.noise_clients=4",
            *_with_sets(["privacy.clip=0.5", "privacy.noise_multiplier=1.1",
                         "privacy.delta=0.001"])]
    cluster.add_node(0.0, "--clients", "0-5")
    cluster.add_node(0.0, "--clients", "6-11")
    nodes_file = local_cluster.write_nodes_file(cluster.workdir / "compute_nodes.txt",
                                                cluster.nodes)
    cluster.coordinator = local_cluster.start_coordinator(
        cluster.workdir, nodes_file, 2,
        env={**local_cluster.python_env(), DIES_AT_VARIABLE: "aggregate:3"})
    client = cluster.start_client(*sets, "--run-id", "private", "--quiet",
                                  "--dead-after", "3")
    try:
        assert cluster.coordinator.popen.wait(120) == -signal.SIGKILL, cluster.logs()
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1 and "--resume private" in err, err
    store = cluster.workdir / "runs" / "runs.db"
    assert _charged_rounds(store) == [1, 2, 3]  # round 3 charged before its unmask
    cluster.coordinator = local_cluster.start_coordinator(
        cluster.workdir, nodes_file, 2, "--resume", "private")
    attached = local_cluster.run_client(["attach", "127.0.0.1",
                                         str(cluster.coordinator.port), "private", "--json",
                                         "--poll", "0.2"], cluster.workdir, timeout=300)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    cluster.coordinator.wait_for(r"resumes after round 2 ")
    assert _charged_rounds(store) == [1, 2, 3, 3, 4]
    expected = _fixed_sampling_epsilons(rounds + 1)
    rows = [json.loads(line) for line in
            (cluster.workdir / "runs" / "private" / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(1, rounds + 1))
    # rounds 1 and 2 as charged once each; round 3 is the 4th release, round 4 the 5th
    assert [row["epsilon"] for row in rows] == pytest.approx(
        [expected[0], expected[1], expected[3], expected[4]], rel=5e-4)
    assert json.loads(attached.stdout)["clients"]["epsilon"] == rows[-1]["epsilon"]
    assert _status_epsilon(cluster) == rows[-1]["epsilon"]
    # a coordinator started afresh reads the run from the store (coordinator/stored_status.py)
    cluster.coordinator.stop()
    cluster.coordinator = local_cluster.start_coordinator(cluster.workdir, nodes_file, 2)
    assert _status_epsilon(cluster) == rows[-1]["epsilon"]


def _status_epsilon(cluster) -> float:
    """The epsilon `client.py status` shows of the run."""
    status = local_cluster.run_client(["status", "127.0.0.1", str(cluster.coordinator.port),
                                       "private", "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)["clients"]["epsilon"]


def _charged_rounds(store) -> list[int]:
    """The rounds of the run's privacy charges, in order, read with plain SQL."""
    with closing(sqlite3.connect(store)) as db:
        return [r for (r,) in db.execute("SELECT round FROM privacy_charges WHERE run_id = "
                                         "'private' ORDER BY charge")]
