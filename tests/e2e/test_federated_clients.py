"""Federated clients through real processes: the letters data dealt to clients by a seeded
rule, two nodes that each hold some of them (``--clients``), a few clients sampled per
round. Each client's units go only to its holder, the final model is the weighted FedAvg of
exactly those clients computed in one process, the run folder keeps the partition and the
clients' lines, and a holder killed mid-run drops its clients while the run goes on."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools import local_cluster
from devtools.fedavg_replay import replay as _replay
from tests.conftest import Cluster
from tests.waiting import wait_until
from thrift_trainer.engine.nodes.client import RunQuery
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.thrift_client import ThriftNodeClient
from thrift_trainer.training.outputs.model_file import load_model

pytestmark = pytest.mark.processes

CLIENTS = 12
SHIPPED = Path(__file__).resolve().parents[2] / "data" / "letters"
FEDERATED = ["--set", "run.model=mlp_classifier", "--set", "run.dataset=letters",
             "--set", "data.format=letters", "--set", "run.algorithm=delta_avg",
             "--set", "delta_avg.epochs=1", "--set", "delta_avg.local_optimizer=sgd",
             "--set", "delta_avg.eta=0.05", "--set", "delta_avg.batch_size=50",
             "--set", f"clients.count={CLIENTS}", "--set", "clients.partition=dirichlet",
             "--set", "clients.alpha=0.5", "--set", "clients.per_round=4"]


def _run_dir(cluster: Cluster, result: dict) -> Path:
    return cluster.workdir / "runs" / result["run_id"]


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]


def _attempt_nodes(store: Path, run_id: str) -> dict[str, set[str]]:
    """client -> the ports of the nodes the run store's ledger sent any attempt of it to."""
    import sqlite3

    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT unit_id, node FROM attempts WHERE run_id = ?",
                          (run_id,)).fetchall()
    placed: dict[str, set[str]] = {}
    for unit, node in rows:
        placed.setdefault(unit, set()).add(node.rpartition(":")[2])
    return placed


@pytest.fixture(scope="module")
def holders(module_cluster: Cluster) -> Cluster:
    """Two nodes holding clients 0-5 and 6-11 and a coordinator with a run store of its
    own (store.sqlite), which the tests that need no other cluster train through, each run
    under its own run id."""
    module_cluster.add_node(0.0, "--clients", "0-5")
    module_cluster.add_node(0.0, "--clients", "6-11")
    module_cluster.start_coordinator(2, "--store", str(module_cluster.workdir / "store.sqlite"))
    return module_cluster


def test_clients_train_only_on_their_holders_and_equal_an_in_process_fedavg(holders):
    cluster, (low, high) = holders, holders.nodes
    store = cluster.workdir / "store.sqlite"
    result = cluster.train_json(*FEDERATED, "--set", "run.rounds=3", "--run-id", "holders")
    run_dir = _run_dir(cluster, result)
    lines = _lines(run_dir)
    trained = [line for line in lines if "node" in line]
    assert len(trained) == 3 * 4, lines  # 4 clients a round, none dropped or failed
    holder = {str(low.port): range(0, 6), str(high.port): range(6, 12)}
    for line in trained:
        index = int(line["client"].removeprefix("client"))
        port = line["node"].rpartition(":")[2]
        assert index in holder[port], line  # a client's result came from its holder
    attempts = _attempt_nodes(store, result["run_id"])
    assert set(attempts) == {line["client"] for line in trained}, attempts
    for client, ports in attempts.items():  # every attempt went to the holder
        assert all(int(client[6:]) in holder[port] for port in ports), (client, ports)
    partition = json.loads((run_dir / "partition.json").read_text())
    assert partition["partitioner"] == "dirichlet" and len(partition["sizes"]) == CLIENTS
    for line in trained:
        assert line["examples"] == partition["sizes"][int(line["client"][6:])], line
    assert (run_dir / "partition.png").stat().st_size > 0
    weights, _ = load_model(run_dir / "model.npz")
    expected = _partitioned_replay(trained, rounds=3)
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def _partitioned_replay(trained: list[dict], rounds: int) -> dict:
    """Each round's clients as the run's lines name them, on the shipped data."""
    def clients_of(round_index: int) -> list[tuple[str, Path]]:
        names = sorted((line["client"] for line in trained if line["round"] == round_index),
                       key=lambda name: int(name[6:]))
        return [(name, SHIPPED) for name in names]
    return _replay(_overrides(), rounds, clients_of)


def _overrides() -> list[str]:
    return [FEDERATED[k + 1] for k in range(0, len(FEDERATED), 2)]


def test_a_holder_killed_mid_run_drops_its_clients_until_it_is_back(cluster):
    # the other holder computes slowly, so that the run outlasts the killed one's restart
    cluster.add_node(0.0, "--clients", "0-5", "--slowdown", "4")
    doomed = cluster.add_node(0.0, "--clients", "6-11", "--crash-after-units", "3")
    cluster.start_coordinator(2)
    client = cluster.start_client(*FEDERATED, "--set", "run.rounds=30", "--json")
    try:
        doomed.popen.wait(timeout=60)  # it crashes as planned, mid-run
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node did not crash after 3 units:\n{cluster.logs()}")
    # silent long enough to be suspect, its clients drop out before it is back
    cluster.coordinator.wait_for(r"dropped out: no live node holds", timeout=60)
    back = local_cluster.start("compute_node.py", [str(doomed.port), "0.0", "--host",
                                                   "127.0.0.1", "--clients", "6-11"],
                               cluster.workdir, "node2-back")
    cluster.nodes.append(back)
    out, err = client.communicate(timeout=150)
    assert client.returncode == 0, err + cluster.logs()
    result = json.loads(out)
    assert len(result["history"]) == 30, result
    lines = _lines(_run_dir(cluster, result))
    dropped = [line for line in lines if "dropped" in line]
    assert dropped, lines
    assert all(int(line["client"][6:]) >= 6 for line in dropped), dropped
    assert not [line for line in lines if "failed" in line], lines
    came_back = [line for line in lines if "node" in line and int(line["client"][6:]) >= 6
                 and line["round"] > max(d["round"] for d in dropped)]
    assert came_back, lines  # its clients took part again once it was back


def test_a_pull_node_gets_only_the_clients_it_announced_at_registration(cluster):
    """A pull node is never asked at the run check: it says which clients it holds when it
    registers (--clients), and only their units come to it."""
    cluster.add_node(0.0)  # a pushed node holding every client
    cluster.start_coordinator(2)
    puller = local_cluster.start_pull_node(cluster.workdir, "puller", cluster.coordinator.port,
                                           0.0, "--clients", "0-5")
    cluster.nodes.append(puller)
    result = cluster.train_json(*FEDERATED, "--set", "clients.per_round=0",
                                "--set", "run.rounds=2")
    placed = _attempt_nodes(cluster.workdir / "runs" / "runs.db", result["run_id"])
    pulled = sorted(int(unit[6:]) for unit, nodes in placed.items() if "puller" in nodes)
    assert pulled and max(pulled) <= 5, (placed, cluster.logs())
    lines = _lines(_run_dir(cluster, result))
    assert len([line for line in lines if "node" in line]) == 2 * CLIENTS  # none dropped


def test_a_thousand_clients_sampled_ten_a_round_over_selected_on_two_nodes(cluster):
    cluster.add_node(0.0, "--clients", "0-499")
    cluster.add_node(0.0, "--clients", "500-999")
    cluster.start_coordinator(2)
    many = [item.replace(f"clients.count={CLIENTS}", "clients.count=1000")
            .replace("clients.per_round=4", "clients.per_round=10")
            .replace("clients.partition=dirichlet", "clients.partition=iid")
            for item in FEDERATED]
    # 13 asked a round (over-selected by 30 %), closed at the first 10 in
    result = cluster.train_json(*many, "--set", "run.rounds=3", "--set",
                                "delta_avg.batch_size=8", "--set", "clients.over_select=1.3")
    run_dir = _run_dir(cluster, result)
    lines = _lines(run_dir)
    assert [sum(1 for line in lines if line["round"] == r and "node" in line)
            for r in (1, 2, 3)] == [10, 10, 10], lines
    asked = {line["client"] for line in lines}
    assert len(asked) > 25  # each round samples its own ten of the thousand
    assert len(json.loads((run_dir / "partition.json").read_text())["sizes"]) == 1000
    assert result["history"][-1]["clients_trained"] == 10
    status = local_cluster.run_client(["status", "127.0.0.1", str(cluster.coordinator.port),
                                       result["run_id"], "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    figures = json.loads(status.stdout)["clients"]
    assert figures["clients_trained"] == 10 and figures["client_loss_mean"] > 0, figures


# ---------------------------------------------------------------- node-resident clients
RESIDENT = [item for item in FEDERATED if not item.startswith("clients.")
            and item != "--set"]


def _own_letters(root: Path, files: range, keep, folder: str = "letters") -> int:
    """A node's own letters data in ``root/folder``: the rows of the shipped train files
    ``files`` whose label ``keep`` accepts, and the shipped validation file (so that every
    node knows all 26 labels); returns its training rows."""
    folder = root / folder
    folder.mkdir(parents=True)
    rows = [line for k in files
            for line in (SHIPPED / f"train_letters{k}.txt").read_text().splitlines()
            if line.strip() and keep(int(line.rsplit(",", 1)[1]))]
    (folder / "train_own.txt").write_text("\n".join(rows) + "\n")
    (folder / "validate_letters.txt").write_text(
        (SHIPPED / "validate_letters.txt").read_text())
    return len(rows)


class Sites:
    """Two nodes with letters data of their own (site-a: labels below 13 of a shipped
    train file, site-b: labels from 9 of another) and a coordinator: ``roots`` and ``sizes``
    (training rows) by site key, ``nodes`` by site key."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.roots = {key: cluster.workdir / f"data_{key}" for key in "ab"}
        self.sizes = {"a": _own_letters(self.roots["a"], range(1, 2), lambda label: label < 13),
                      "b": _own_letters(self.roots["b"], range(2, 3), lambda label: label >= 9)}
        self.nodes = {key: cluster.add_node(0.0, "--data-root", str(root), "--node-id",
                                            f"site-{key}")
                      for key, root in self.roots.items()}
        cluster.start_coordinator(2)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    """The sites the node-resident tests train through, each run under its own run id."""
    cluster = Cluster(tmp_path_factory.mktemp("sites"))
    try:
        yield Sites(cluster)
    finally:
        cluster.stop()


def test_nodes_with_their_own_data_train_fedavg_equal_to_an_in_process_replay(sites):
    cluster, roots, sizes, nodes = sites.cluster, sites.roots, sites.sizes, sites.nodes
    result = cluster.train_json(*_with_sets(RESIDENT + ["clients.placement=nodes",
                                                        "run.rounds=3"]),
                                "--run-id", "resident-fedavg")
    run_dir = _run_dir(cluster, result)
    record = json.loads((run_dir / "partition.json").read_text())
    assert record["names"] == ["site-a", "site-b"], record
    assert record["sizes"] == [sizes["a"], sizes["b"]], record
    assert max(int(label) for label in record["label_counts"][0]) < 13  # a's own labels
    assert min(int(label) for label in record["label_counts"][1]) >= 9
    lines = _lines(run_dir)
    assert [(line["round"], line["client"], line["node"].rpartition(":")[2])
            for line in lines] == [(r, f"site-{key}", str(nodes[key].port))
                                   for r in (1, 2, 3) for key in "ab"], lines
    weights, _ = load_model(run_dir / "model.npz")
    expected = _resident_replay(roots, rounds=3)
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def _with_sets(overrides: list[str]) -> list[str]:
    return [part for item in overrides for part in ("--set", item)]


def _resident_replay(roots: dict[str, Path], rounds: int) -> dict:
    """FedAvg of the two nodes' own data computed in this process, weighed by their sizes."""
    sites = [(f"site-{key}", roots[key] / "letters") for key in "ab"]
    return _replay(RESIDENT + ["clients.placement=nodes"], rounds, lambda _: sites)


# --------------------------------------- several node-resident clients on one node
# examples/plugins/sites.py: each folder under <data root>/sites is a client of its node
SITES_PLUGIN = ("--plugins", "sites", "--plugin-dir", str(local_cluster.REPO / "examples"
                                                        / "plugins"))
SITES = [item for item in RESIDENT if not item.startswith(("run.dataset", "data.format"))] \
    + ["run.dataset=sites:sites", "clients.placement=nodes"]


def _sites(root: Path, sites: dict[str, tuple[range, Callable[[int], bool]]]) -> dict[str, int]:
    """Client folders ``root/sites/<name>`` of letters rows (see `_own_letters`); their
    training rows by name."""
    return {name: _own_letters(root, files, keep, f"sites/{name}")
            for name, (files, keep) in sites.items()}


def four_sites(workdir: Path, clinic_files: range = range(5, 7)
               ) -> tuple[dict[str, Path], dict[str, int]]:
    """Data roots ``a`` (clients ward-1, ward-2 and ward-3), ``b`` (clinic) and
    ``coordinator`` (its own validation part) under ``workdir``, and the clients' training
    rows by name: sizes and label mixes all differ."""
    roots = {key: workdir / f"data_{key}" for key in ("a", "b", "coordinator")}
    sizes = _sites(roots["a"], {"ward-1": (range(1, 3), lambda label: label < 13),
                                "ward-2": (range(3, 4), lambda label: label >= 9),
                                "ward-3": (range(4, 5), lambda label: label % 2 == 0)})
    sizes |= _sites(roots["b"], {"clinic": (clinic_files, lambda label: True)})
    _sites(roots["coordinator"], {"central": (range(7, 8), lambda label: True)})
    return roots, sizes


def test_a_node_holding_three_clients_and_one_holding_one_train_fedavg_as_a_replay(cluster):
    roots, sizes = four_sites(cluster.workdir)
    assert len(set(sizes.values())) == 4  # sizes and label mixes all differ
    nodes = {key: cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
             for key in "ab"}
    cluster.start_coordinator(2, "--data-root", str(roots["coordinator"]), *SITES_PLUGIN)
    result = cluster.train_json(*_with_sets(SITES + ["clients.per_round=3",
                                                     "run.rounds=3"]))
    run_dir = _run_dir(cluster, result)
    record = json.loads((run_dir / "partition.json").read_text())
    names = ["clinic", "ward-1", "ward-2", "ward-3"]
    assert record["names"] == names and record["sizes"] == [sizes[n] for n in names], record
    assert max(int(label) for label in record["label_counts"][1]) < 13  # ward-1's own
    assert min(int(label) for label in record["label_counts"][2]) >= 9  # ward-2's own
    assert all(int(label) % 2 == 0 for label in record["label_counts"][3])
    holder = {name: str(nodes["b" if name == "clinic" else "a"].port) for name in names}
    lines = _lines(run_dir)
    assert [sum(1 for line in lines if line["round"] == r) for r in (1, 2, 3)] == [3, 3, 3]
    for line in lines:  # a line per client and round, each computed by its holder
        assert line["node"].rpartition(":")[2] == holder[line["client"]], line
        assert line["examples"] == sizes[line["client"]], line
    assert len({line["client"] for line in lines}) == 4  # drawn among both nodes' clients
    attempts = _attempt_nodes(cluster.workdir / "runs" / "runs.db", result["run_id"])
    assert set(attempts) == {line["client"] for line in lines}, attempts
    for client, ports in attempts.items():  # the ledger: each client's units on its holder
        assert ports == {holder[client]}, (client, ports)
    weights, _ = load_model(run_dir / "model.npz")
    folders = {name: roots["b" if name == "clinic" else "a"] / "sites" / name
               for name in names}

    def clients_of(round_index: int) -> list[tuple[str, Path]]:
        asked = sorted(line["client"] for line in lines if line["round"] == round_index)
        return [(name, folders[name]) for name in asked]
    # each client replayed from its own folder read as plain letters files: one client each
    expected = _replay(RESIDENT + ["clients.placement=nodes"], 3, clients_of)
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_two_nodes_announcing_one_client_name_with_different_data_refuse_the_run(cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in "ab"}
    _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True),
                        "ward-2": (range(2, 3), lambda label: True)})
    _sites(roots["b"], {"ward-2": (range(3, 4), lambda label: True)})
    nodes = [cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
             for key in "ab"]
    cluster.start_coordinator(2, "--data-root", str(roots["a"]), *SITES_PLUGIN)
    done = cluster.client(*_with_sets(SITES + ["run.rounds=2"]), "--json")
    assert done.returncode != 0, done.stdout
    ports = sorted(str(node.port) for node in nodes)
    refusal = [line for line in done.stderr.splitlines() if "'ward-2'" in line]
    assert len(refusal) == 1, done.stderr
    assert "client 'ward-2' is announced by nodes" in refusal[0], refusal
    assert all(port in refusal[0] for port in ports), refusal
    assert "must be unique across nodes" in refusal[0], refusal
    assert not list((cluster.workdir / "runs").glob("*/clients.jsonl"))  # no round ran


def test_a_node_back_after_round_1_with_a_taken_name_of_other_data_is_left_out(cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in "ac"}
    _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True),
                        "ward-2": (range(2, 3), lambda label: True)})
    _sites(roots["c"], {"ward-2": (range(3, 4), lambda label: True)})
    holder = cluster.add_node(0.0, "--data-root", str(roots["a"]), "--slowdown", "4",
                              *SITES_PLUGIN)
    late = cluster.add_node(0.0, "--data-root", str(roots["c"]), *SITES_PLUGIN)
    late.stop()  # listed, but silent at the run check: its clients are asked for later
    cluster.start_coordinator(2, "--data-root", str(roots["a"]), *SITES_PLUGIN)
    client = cluster.start_client(*_with_sets(SITES + ["run.rounds=60"]), "--json")
    try:
        cluster.coordinator.wait_for(r"round 1/60", timeout=60)
        back = local_cluster.start("compute_node.py", [
            str(late.port), "0.0", "--host", "127.0.0.1", "--data-root", str(roots["c"]),
            *SITES_PLUGIN], cluster.workdir, "late-back")
        cluster.nodes.append(back)
        left = cluster.coordinator.wait_for(
            rf"node 127.0.0.1:{late.port} is left out of run \S+: (client 'ward-2' .*)",
            timeout=60)
        out, err = client.communicate(timeout=150)
    finally:
        if client.poll() is None:
            client.kill()
    assert f"nodes 127.0.0.1:{holder.port} and 127.0.0.1:{late.port} with different data" \
        in left.group(1), left.group(0)
    assert client.returncode == 0, err + cluster.logs()  # the run went on without it
    result = json.loads(out)
    lines = _lines(_run_dir(cluster, result))
    assert len(lines) == 2 * 60, lines[-3:]
    assert {line["node"].rpartition(":")[2] for line in lines} == {str(holder.port)}


def test_each_of_a_nodes_clients_is_scored_on_its_own_validation_part(cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in "ab"}
    sizes = _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True),
                                "ward-2": (range(2, 3), lambda label: label < 13)})
    sizes |= _sites(roots["b"], {"clinic": (range(3, 4), lambda label: True)})
    # ward-2's own validation rows: the shipped ones of its labels; ward-1 has none of its
    # own, so clients.validation_fraction of its rows are held out for it
    shipped = (SHIPPED / "validate_letters.txt").read_text().split()
    ward_2 = [row for row in shipped if int(row.rsplit(",", 1)[1]) < 13]
    (roots["a"] / "sites" / "ward-2" / "validate_letters.txt").write_text(
        "\n".join(ward_2) + "\n")
    (roots["a"] / "sites" / "ward-1" / "validate_letters.txt").unlink()
    nodes = {key: cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
             for key in "ab"}
    cluster.start_coordinator(2, "--data-root", str(roots["b"]), *SITES_PLUGIN)
    result = cluster.train_json(*_with_sets(SITES + [
        "run.rounds=2", "clients.eval_every=1", "clients.validation_fraction=0.2"]))
    run_dir = _run_dir(cluster, result)
    record = json.loads((run_dir / "partition.json").read_text())
    held = sizes["ward-1"] // 5  # floor(0.2 x its rows)
    assert record["names"] == ["clinic", "ward-1", "ward-2"], record
    assert record["sizes"] == [sizes["clinic"], sizes["ward-1"] - held, sizes["ward-2"]]
    validation = {"clinic": len(shipped), "ward-1": held, "ward-2": len(ward_2)}
    port = {"clinic": str(nodes["b"].port), "ward-1": str(nodes["a"].port),
            "ward-2": str(nodes["a"].port)}
    evaluated = [line for line in _lines(run_dir) if line.get("kind") == "eval"]
    assert sorted((line["round"], line["client"]) for line in evaluated) == \
        [(r, name) for r in (1, 2) for name in ("clinic", "ward-1", "ward-2")], evaluated
    for line in evaluated:  # each scored by its holder on its own validation part
        assert line["node"].rpartition(":")[2] == port[line["client"]], line
        assert line["examples"] == validation[line["client"]], line
        assert 0 <= line["val_accuracy"] <= 1, line
    assert result["history"][-1]["clients_evaluated"] == 3


# ------------------------------------------------ buffered asynchronous training (FedBuff)
FEDBUFF_CLIENTS = 20


def test_buffered_mode_draws_clients_only_to_their_holders_and_applies_each_buffer(cluster):
    half = cluster.add_node(0.0, "--clients", "0-9")
    cluster.add_node(0.0)  # holds every client
    store = cluster.workdir / "store.sqlite"
    cluster.start_coordinator(2, "--store", str(store))
    sets = [item.replace(f"clients.count={CLIENTS}", f"clients.count={FEDBUFF_CLIENTS}")
            for item in FEDERATED]
    # 4 clients train at once (2 nodes, each with one unit sent ahead); a version every 3
    # results, 2 versions a round (4 clients a round, in whole buffers)
    result = cluster.train_json(*sets, "--set", "run.rounds=3", "--set",
                                "schedule.mode=buffered", "--set", "schedule.buffer_size=3",
                                "--set", "schedule.prefetch=1", "--set",
                                "schedule.max_staleness=20")
    assert len(result["history"]) == 3, result
    run_dir = _run_dir(cluster, result)
    lines = _lines(run_dir)
    trained = [line for line in lines if "node" in line]
    assert not [line for line in lines if "node" not in line], lines  # none failed, dropped
    # every version applied exactly one full buffer, in the round it belongs to
    assert sorted(Counter(line["version"] for line in trained).items()) == \
        [(version, 3) for version in range(1, 7)], trained
    assert all(line["round"] == (line["version"] + 1) // 2 for line in trained), trained
    partition = json.loads((run_dir / "partition.json").read_text())
    for line in trained:
        assert line["examples"] == partition["sizes"][int(line["client"][6:])], line
        if line["node"].endswith(f":{half.port}"):
            assert int(line["client"][6:]) < 10, line  # the half node computed its own
    attempts = _attempt_nodes(store, result["run_id"])
    assert all(unit.partition(".d")[0].startswith("client") for unit in attempts), attempts
    for unit, ports in attempts.items():  # every attempt of a client went to a holder
        if int(unit.partition(".d")[0][6:]) >= 10:
            assert str(half.port) not in ports, (unit, ports)
    assert len({line["client"] for line in trained}) > 6  # drawn among many clients
    assert result["history"][-1]["clients_trained"] > 0


def _fedbuff_sets(rounds: int) -> list[str]:
    sets = [item.replace(f"clients.count={CLIENTS}", f"clients.count={FEDBUFF_CLIENTS}")
            for item in FEDERATED]
    return [*sets, "--set", f"run.rounds={rounds}", "--set", "schedule.mode=buffered",
            "--set", "schedule.buffer_size=3", "--set", "schedule.prefetch=1",
            "--set", "schedule.max_staleness=20"]


def test_a_buffered_run_with_clients_resumes_after_a_kill_and_applies_each_buffer_once(
        cluster):
    half = cluster.add_node(0.0, "--clients", "0-9", "--slowdown", "4")
    cluster.add_node(0.0, "--slowdown", "4")
    cluster.start_coordinator(2)
    client = cluster.start_client(*_fedbuff_sets(12), "--run-id", "fedbuff", "--quiet",
                                  "--dead-after", "3")
    try:
        cluster.coordinator.wait_for(r"round 3/12", timeout=120)
        cluster.coordinator.kill()  # SIGKILL: the draws out and the buffer are lost
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 1 and "--resume fedbuff" in err, err
    cluster.coordinator = local_cluster.start_coordinator(
        cluster.workdir, cluster.workdir / "compute_nodes.txt", 2, "--resume", "fedbuff")
    attached = local_cluster.run_client(["attach", "127.0.0.1",
                                         str(cluster.coordinator.port), "fedbuff", "--json",
                                         "--poll", "0.2"], cluster.workdir, timeout=300)
    assert attached.returncode == 0, attached.stderr + cluster.logs()
    assert json.loads(attached.stdout)["state"] == "completed"
    resumed_after = int(cluster.coordinator.wait_for(r"resumes after round (\d+)").group(1))
    assert 2 <= resumed_after < 12
    lines = _lines(cluster.workdir / "runs" / "fedbuff")
    trained = [line for line in lines if "node" in line]
    # each of the 24 versions applied exactly one buffer of 3 clients: none twice, none lost
    assert sorted(Counter(line["version"] for line in trained).items()) == \
        [(version, 3) for version in range(1, 25)], trained
    assert all(line["round"] == (line["version"] + 1) // 2 for line in trained), trained
    for line in trained:
        if line["node"].endswith(f":{half.port}"):
            assert int(line["client"][6:]) < 10, line
    rows = (cluster.workdir / "runs" / "fedbuff" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["round"] for row in rows] == list(range(1, 13))
    assert all(json.loads(row)["clients_trained"] >= 1 for row in rows)


def test_nodes_with_their_own_data_train_in_buffered_mode(sites):
    cluster, nodes = sites.cluster, sites.nodes
    result = cluster.train_json(*_with_sets(RESIDENT + [
        "clients.placement=nodes", "run.rounds=3", "schedule.mode=buffered",
        "schedule.buffer_size=2", "schedule.updates_per_round=2"]), "--run-id", "resident-buffered")
    assert len(result["history"]) == 3, result
    trained = [line for line in _lines(_run_dir(cluster, result)) if "node" in line]
    assert sorted(Counter(line["version"] for line in trained).items()) == \
        [(version, 2) for version in range(1, 7)], trained
    for line in trained:  # each site's own data trained on that site alone
        assert line["node"].endswith(f":{nodes[line['client'][-1]].port}"), line

# ---------------------------------------------------------------- federated evaluation
EVALUATED = ["--set", "clients.validation_fraction=0.2", "--set", "clients.eval_every=2",
             "--set", "clients.eval_per_round=5"]


def test_federated_evaluation_scores_clients_on_their_holders_every_n_rounds(holders):
    cluster, (low, high) = holders, holders.nodes
    result = cluster.train_json(*FEDERATED, *EVALUATED, "--set", "run.rounds=3",
                                "--run-id", "evaluated")
    run_dir = _run_dir(cluster, result)
    lines = _lines(run_dir)
    evaluated = [line for line in lines if line.get("kind") == "eval"]
    trained = [line for line in lines if "kind" not in line]
    # every second round and after the last, five clients each, none missed
    assert sorted({line["round"] for line in evaluated}) == [2, 3], evaluated
    assert all(sum(1 for line in evaluated if line["round"] == r) == 5 for r in (2, 3))
    holder = {str(low.port): range(0, 6), str(high.port): range(6, 12)}
    partition = json.loads((run_dir / "partition.json").read_text())
    for line in evaluated:  # scored by its holder, on its validation part
        index = int(line["client"][6:])
        assert index in holder[line["node"].rpartition(":")[2]], line
        assert line["examples"] == partition["validation_sizes"][index], line
        assert 0 <= line["val_accuracy"] <= 1 and line["val_loss"] > 0, line
    assert len(trained) == 3 * 4 and all(line["loss_before"] > 0 for line in trained), trained
    for line in trained:  # trained on the examples left once its validation part is out
        assert line["examples"] == partition["sizes"][int(line["client"][6:])], line
    rows = {row["round"]: row for row in _metrics(run_dir)}
    assert [r for r, row in rows.items() if "federated_val_accuracy" in row] == [2, 3]
    for r in (2, 3):
        scored = [line for line in evaluated if line["round"] == r]
        total = sum(line["examples"] for line in scored)
        for key in ("val_accuracy", "val_loss"):
            weighted = sum(line["examples"] * line[key] for line in scored) / total
            assert rows[r][f"federated_{key}"] == pytest.approx(weighted, rel=1e-9), (r, key)
        assert rows[r]["client_val_accuracy_worst10"] == min(
            line["val_accuracy"] for line in scored)  # one client of five is the worst 10 %
    assert result["history"][-1]["federated_val_accuracy"] == rows[3]["federated_val_accuracy"]
    status = local_cluster.run_client(["status", "127.0.0.1", str(cluster.coordinator.port),
                                       result["run_id"], "--json"], cluster.workdir)
    assert status.returncode == 0, status.stderr
    figures = json.loads(status.stdout)["clients"]
    assert figures["federated_val_accuracy"] == rows[3]["federated_val_accuracy"], figures
    # the last evaluation scored the saved model: one client's accuracy, in this process
    # (the nodes' error rate is a float32 mean: equal to a few parts in 1e8)
    line = evaluated[-1]
    assert line["val_accuracy"] == pytest.approx(
        _accuracy_on_validation(run_dir, line["client"]), abs=1e-6), line


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _accuracy_on_validation(run_dir: Path, client: str, clients: int = CLIENTS) -> float:
    """The saved model's accuracy on ``client``'s validation examples, as this process
    deals and splits the shipped data among ``clients`` (its own forward pass, not the
    nodes' code)."""
    import torch

    from thrift_trainer.training.algorithms import torch_model
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
    from thrift_trainer.training.clients.data_parts import validation_parts_of
    from thrift_trainer.training.models import modules
    from thrift_trainer.training.run_config import load_run_config

    overrides = [item.replace(f"clients.count={CLIENTS}", f"clients.count={clients}")
                 for item in _overrides()] + [EVALUATED[k + 1]
                                              for k in range(0, len(EVALUATED), 2)]
    spec = load_run_config(None, overrides).to_spec()
    config = DeltaAveraging.check_config("mlp_classifier", spec.algorithm_config())
    setup = torch_model.setup_of("mlp_classifier", config, "letters", SHIPPED)
    held = validation_parts_of(setup, spec.clients, config["seed"])[int(client[6:])]
    weights, _ = load_model(run_dir / "model.npz")
    module = setup.build()
    modules.load_arrays(module, weights)
    module.eval()
    inputs, targets = setup.data.train.take(held)
    with torch.no_grad():
        predicted = module(inputs).argmax(dim=1)
    return float((predicted == targets).double().mean())


def test_node_resident_clients_are_scored_on_their_own_validation_part(sites):
    cluster, sizes, nodes = sites.cluster, sites.sizes, sites.nodes
    # a validation_fraction too: it holds nothing out of data that has its own validation part
    result = cluster.train_json(*_with_sets(RESIDENT + [
        "clients.placement=nodes", "run.rounds=2", "clients.eval_every=1",
        "clients.validation_fraction=0.5"]), "--run-id", "resident-scored")
    run_dir = _run_dir(cluster, result)
    assert json.loads((run_dir / "partition.json").read_text())["sizes"] == [sizes["a"],
                                                                              sizes["b"]]
    validation_rows = len((SHIPPED / "validate_letters.txt").read_text().split())
    evaluated = [line for line in _lines(run_dir) if line.get("kind") == "eval"]
    assert [(line["round"], line["client"], line["node"].rpartition(":")[2], line["examples"])
            for line in evaluated] == [(r, f"site-{key}", str(nodes[key].port), validation_rows)
                                       for r in (1, 2) for key in "ab"], evaluated
    # both score the same shipped validation file with the same weights
    assert evaluated[2]["val_accuracy"] == evaluated[3]["val_accuracy"]
    assert result["history"][-1]["clients_evaluated"] == 2


def test_federated_evaluation_in_buffered_mode_scores_each_rounds_last_version(cluster):
    half = cluster.add_node(0.0, "--clients", "0-9")
    cluster.add_node(0.0)  # holds every client
    cluster.start_coordinator(2)
    result = cluster.train_json(*_fedbuff_sets(3), *EVALUATED)
    run_dir = _run_dir(cluster, result)
    lines = _lines(run_dir)
    evaluated = [line for line in lines if line.get("kind") == "eval"]
    trained = [line for line in lines if "kind" not in line and "node" in line]
    # the stream itself is as without evaluation: a full buffer per version
    assert sorted(Counter(line["version"] for line in trained).items()) == \
        [(version, 3) for version in range(1, 7)], trained
    # every second round and after the last, five clients each, none missed
    assert [(r, sum(1 for line in evaluated if line["round"] == r)) for r in (2, 3)] == \
        [(2, 5), (3, 5)] and len(evaluated) == 10, evaluated
    partition = json.loads((run_dir / "partition.json").read_text())
    for line in evaluated:
        index = int(line["client"][6:])
        assert line["examples"] == partition["validation_sizes"][index], line
        assert 0 <= line["val_accuracy"] <= 1 and line["val_loss"] > 0, line
        if line["node"].endswith(f":{half.port}"):
            assert index < 10, line  # scored by a holder
    rows = {row["round"]: row for row in _metrics(run_dir)}
    assert [r for r, row in rows.items() if "federated_val_accuracy" in row] == [2, 3]
    for r in (2, 3):
        scored = [line for line in evaluated if line["round"] == r]
        weighted = sum(line["examples"] * line["val_accuracy"] for line in scored) / sum(
            line["examples"] for line in scored)
        assert rows[r]["federated_val_accuracy"] == pytest.approx(weighted, rel=1e-9)
    # the last evaluation scored the final model (round 3's last version)
    line = evaluated[-1]
    assert line["val_accuracy"] == pytest.approx(
        _accuracy_on_validation(run_dir, line["client"], FEDBUFF_CLIENTS), abs=1e-6), line


def test_a_relay_passes_each_evaluation_unit_whole_to_the_member_holding_its_client(cluster):
    low = cluster.add_node(0.0, "--clients", "0-5")
    high = cluster.add_node(0.0, "--clients", "6-11")
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt", [low, high])
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group))
    cluster.nodes.append(relay)
    cluster.start_coordinator(2, nodes=[relay])
    result = cluster.train_json(*FEDERATED, *EVALUATED, "--set", "run.rounds=2")
    run_dir = _run_dir(cluster, result)
    evaluated = [line for line in _lines(run_dir) if line.get("kind") == "eval"]
    partition = json.loads((run_dir / "partition.json").read_text())
    assert [line["round"] for line in evaluated] == [2] * 5, evaluated  # none missed
    for line in evaluated:  # scored whole, on the client's validation part
        assert line["node"].rpartition(":")[2] == str(relay.port), line
        assert line["examples"] == partition["validation_sizes"][int(line["client"][6:])]
        assert 0 <= line["val_accuracy"] <= 1 and line["val_loss"] > 0, line
    assert result["history"][-1]["clients_evaluated"] == 5
    # the relay's members did the scoring, each for the clients it holds
    for member, clients in ((low, range(0, 6)), (high, range(6, 12))):
        scored = {int(match) for match in re.findall(r"unit eval-client(\d+)~r0 round 2 done",
                                                     member.log())}
        assert scored <= set(clients), (scored, member.log())
    assert len(re.findall(r"unit eval-client\d+~r0 round 2 done",
                          low.log() + high.log())) == 5


def test_a_relay_holds_its_members_clients_and_fedavg_through_it_equals_a_replay(cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in ("a", "b", "d", "coordinator")}
    sizes = _sites(roots["a"], {"ward-1": (range(1, 3), lambda label: label < 13),
                                "ward-2": (range(3, 4), lambda label: label >= 9)})
    sizes |= _sites(roots["b"], {"clinic": (range(4, 5), lambda label: label % 2 == 0)})
    sizes |= _sites(roots["d"], {"lab": (range(5, 6), lambda label: True)})
    _sites(roots["coordinator"], {"central": (range(7, 8), lambda label: True)})
    assert len(set(sizes.values())) == 4  # sizes and label mixes all differ
    members = {key: cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
               for key in "ab"}
    direct = cluster.add_node(0.0, "--data-root", str(roots["d"]), *SITES_PLUGIN)
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt",
                                           [members["a"], members["b"]])
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group),
                                     *SITES_PLUGIN)
    cluster.nodes.append(relay)
    cluster.start_coordinator(2, "--data-root", str(roots["coordinator"]), *SITES_PLUGIN,
                              nodes=[relay, direct])
    result = cluster.train_json(*_with_sets(SITES + ["run.rounds=2"]))  # every client a round
    run_dir = _run_dir(cluster, result)
    names = ["clinic", "lab", "ward-1", "ward-2"]
    record = json.loads((run_dir / "partition.json").read_text())
    assert record["names"] == names and record["sizes"] == [sizes[n] for n in names], record
    assert max(int(label) for label in record["label_counts"][2]) < 13  # ward-1's own labels
    holder = {name: str((direct if name == "lab" else relay).port) for name in names}
    lines = _lines(run_dir)
    assert sorted((line["round"], line["client"]) for line in lines) == [
        (r, name) for r in (1, 2) for name in names], lines
    for line in lines:  # the relay's clients came from the relay, the lab from its node
        assert line["node"].rpartition(":")[2] == holder[line["client"]], line
        assert line["examples"] == sizes[line["client"]], line
    attempts = _attempt_nodes(cluster.workdir / "runs" / "runs.db", result["run_id"])
    assert {client: ports for client, ports in attempts.items()} == {
        name: {holder[name]} for name in names}, attempts  # the ledger: only on holders
    # behind the relay, each client's units went whole to the member holding it, only
    for member, own in ((members["a"], ("ward-1", "ward-2")), (members["b"], ("clinic",))):
        done = re.findall(r"unit ([\w-]+) round (\d) done", member.log())
        # (a straggler's backup may have run on its holder too)
        assert set(done) == {(name, str(r)) for name in own for r in (1, 2)}, done
    folders = {name: roots["a" if name.startswith("ward") else "b" if name == "clinic"
                           else "d"] / "sites" / name for name in names}
    weights, _ = load_model(run_dir / "model.npz")
    expected = _replay(RESIDENT + ["clients.placement=nodes"], 2,
                       lambda _: [(name, folders[name]) for name in names])
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def _resident_query(run_id: str, model_fingerprint: str = "") -> RunQuery:
    """The run check of a node-resident run on the sites plug-in's data, as the coordinator
    asks it (with its model's fingerprint, which a relay's members are checked against)."""
    from dataclasses import replace

    from thrift_trainer.training.run_config import load_run_config

    spec = load_run_config(None, SITES).to_spec()
    if model_fingerprint:
        spec = replace(spec, expect={"model": model_fingerprint})
    return RunQuery(run_id, spec.algorithm, spec.model, spec.dataset, spec.to_config_json())


def test_a_relay_announces_its_live_members_clients_and_leaves_a_conflicting_one_out(
        cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in "abc"}
    _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True),
                        "ward-2": (range(2, 3), lambda label: True)})
    _sites(roots["b"], {"clinic": (range(3, 4), lambda label: label < 13)})
    _sites(roots["c"], {"ward-2": (range(4, 5), lambda label: True)})  # other data
    a, b, c = (cluster.add_node(0.0, "--data-root", str(roots[key]), *SITES_PLUGIN)
               for key in "abc")
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt", [a, b, c])
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group),
                                     *SITES_PLUGIN)
    cluster.nodes.append(relay)
    own = _client(a).check_run(_resident_query("r1")).facts  # a's own, asked directly
    query = _resident_query("r1", own.model_fingerprint)
    relayed = _client(relay)

    def announced() -> dict[str, str]:
        return relayed.check_run(query).facts.own_fingerprints

    facts = relayed.check_run(query).facts
    assert facts.clients == ("clinic", "ward-1", "ward-2"), facts
    assert facts.own_fingerprints["ward-2"] == own.own_fingerprints["ward-2"]  # a's, not c's
    assert facts.own_sizes["ward-1"] == own.own_sizes["ward-1"]
    assert max(facts.own_labels["clinic"]) < 13  # b's own label counts
    announced()  # asked again: the conflict is not logged twice
    left_out = re.findall(r"member (\S+) is left out of run r1: client 'ward-2' is announced "
                          r"by nodes (\S+) and (\S+) with different data", relay.log())
    assert left_out == [(f"127.0.0.1:{c.port}", f"127.0.0.1:{a.port}",
                         f"127.0.0.1:{c.port}")], relay.log()
    b.kill()  # its clinic is not the relay's while it is away ...
    assert wait_until(lambda: "clinic" not in announced(), 30.0), announced()
    back = local_cluster.start("compute_node.py", [
        str(b.port), "0.0", "--host", "127.0.0.1", "--data-root", str(roots["b"]),
        *SITES_PLUGIN], cluster.workdir, "b-back")
    cluster.nodes.append(back)  # ... and is again once it is back
    assert wait_until(lambda: "clinic" in announced(), 30.0), relay.log()
    assert sorted(announced()) == ["clinic", "ward-1", "ward-2"]
    _sites(cluster.workdir / "data_d", {"lab": (range(5, 6), lambda label: True)})
    joined = cluster.add_node(0.0, "--data-root", str(cluster.workdir / "data_d"),
                              *SITES_PLUGIN)
    local_cluster.write_nodes_file(group, [a, b, c, joined])  # a member joins the group
    assert sorted(announced()) == ["clinic", "lab", "ward-1", "ward-2"], relay.log()


def _client(node: local_cluster.Proc) -> ThriftNodeClient:
    return ThriftNodeClient(NodeAddress("127.0.0.1", node.port), rpc_timeout=60.0,
                            connect_timeout=5.0)


def test_a_relays_member_killed_mid_run_drops_its_clients_until_it_is_back(cluster):
    roots = {key: cluster.workdir / f"data_{key}" for key in ("a", "b", "coordinator")}
    _sites(roots["a"], {"ward-1": (range(1, 2), lambda label: True)})
    _sites(roots["b"], {"clinic": (range(2, 3), lambda label: True)})
    _sites(roots["coordinator"], {"central": (range(7, 8), lambda label: True)})
    # the other member computes slowly, so that the run outlasts the killed one's restart
    slow = cluster.add_node(0.0, "--data-root", str(roots["a"]), "--slowdown", "4",
                            *SITES_PLUGIN)
    doomed = cluster.add_node(0.0, "--data-root", str(roots["b"]), "--crash-after-units", "3",
                              *SITES_PLUGIN)
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt", [slow, doomed])
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group),
                                     *SITES_PLUGIN)
    cluster.nodes.append(relay)
    cluster.start_coordinator(2, "--data-root", str(roots["coordinator"]), *SITES_PLUGIN,
                              nodes=[relay])
    client = cluster.start_client(*_with_sets(SITES + ["run.rounds=30"]), "--json")
    try:
        try:
            doomed.popen.wait(timeout=60)  # it crashes as planned, mid-run
        except subprocess.TimeoutExpired:
            pytest.fail(f"the member did not crash after 3 units:\n{cluster.logs()}")
        # the relay no longer holds its client: it drops out, the run goes on
        cluster.coordinator.wait_for(r"clinic dropped out: no live node holds it", timeout=60)
        back = local_cluster.start("compute_node.py", [
            str(doomed.port), "0.0", "--host", "127.0.0.1", "--data-root", str(roots["b"]),
            *SITES_PLUGIN], cluster.workdir, "doomed-back")
        cluster.nodes.append(back)
        out, err = client.communicate(timeout=150)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    lines = _lines(_run_dir(cluster, json.loads(out)))
    dropped = [line for line in lines if "dropped" in line]
    assert dropped and {line["client"] for line in dropped} == {"clinic"}, lines
    assert not [line for line in lines if "failed" in line], lines
    came_back = [line for line in lines if "node" in line and line["client"] == "clinic"
                 and line["round"] > max(d["round"] for d in dropped)]
    assert came_back, lines  # the relay holds it again once its member is back
    assert sum(1 for line in lines if line["client"] == "ward-1" and "node" in line) == 30
