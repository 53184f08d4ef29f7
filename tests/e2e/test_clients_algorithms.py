"""Federated clients under the other algorithms and rules, through real processes: sync_sgd
(a client's gradient per unit, K of the sampled clients closing a round) and delta_avg with
robust aggregation rules and compressed updates. Two nodes each hold half of the clients
(``--clients``); every attempt of a client's unit must go to its holder, and the run must
train."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.e2e.test_federated_clients import (
    _attempt_nodes,
    _lines,
    _overrides,
    _run_dir,
    _with_sets,
)
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.outputs.model_file import load_model

pytestmark = pytest.mark.processes

MNIST_DIR = DEFAULT_DATA_ROOT / "mnist"
CHANCE = 1 - 1 / 26  # the validation error of a model that guesses a letter


def _federated(**changes: str) -> list[str]:
    """The federated letters run of tests/e2e/test_federated_clients.py as --set
    arguments, with keys changed (a value of "" drops the key)."""
    settings = dict(item.split("=", 1) for item in _overrides())
    settings.update(changes)
    return _with_sets([f"{key}={value}" for key, value in settings.items() if value])


@pytest.fixture(scope="module")
def holders(module_cluster) -> tuple:
    """Two nodes, clients 0-5 on one and 6-11 on the other, and a coordinator with a run
    store of its own (store.sqlite), which the sync_sgd and delta_avg runs of clients train
    through, each under its own run id: the cluster, and port -> the indices held."""
    low = module_cluster.add_node(0.0, "--clients", "0-5")
    high = module_cluster.add_node(0.0, "--clients", "6-11")
    module_cluster.start_coordinator(2, "--store", str(module_cluster.workdir / "store.sqlite"))
    return module_cluster, {str(low.port): range(0, 6), str(high.port): range(6, 12)}


def _check_placement(cluster, result: dict, holder: dict[str, range],
                     client_of=lambda unit_id: unit_id) -> list[dict]:
    """Every attempt and every result of a client came from a node that holds it; the
    clients' trained lines. ``client_of``: the client a unit id names."""
    trained = [line for line in _lines(_run_dir(cluster, result)) if "node" in line]
    for line in trained:
        assert int(line["client"][6:]) in holder[line["node"].rpartition(":")[2]], line
    attempts = _attempt_nodes(cluster.workdir / "store.sqlite", result["run_id"])
    clients = {client_of(unit_id) for unit_id in attempts}
    assert clients >= {line["client"] for line in trained}, attempts
    for unit_id, ports in attempts.items():
        index = int(client_of(unit_id)[6:])
        assert all(index in holder[port] for port in ports), (unit_id, ports)
    return trained


def test_sync_sgd_takes_one_gradient_per_sampled_client_on_its_holder(holders):
    cluster, holder = holders
    dropped = {item.split("=")[0]: "" for item in _overrides() if item.startswith("delta_avg.")}
    result = cluster.train_json(
        *_federated(**{"run.algorithm": "sync_sgd"}, **dropped),
        "--set", "sync_sgd.num_workunits_per_update=3", "--set", "sync_sgd.lr=0.01",
        "--set", "sync_sgd.images_per_work_unit=200", "--set", "sync_sgd.batch_size=50",
        "--set", "run.rounds=6", "--run-id", "sync-sgd-clients")
    trained = _check_placement(cluster, result, holder)
    # 4 clients asked a round, the first 3 gradients close it (K of N)
    assert [sum(1 for line in trained if line["round"] == r) for r in range(1, 7)] == [3] * 6
    sizes = json.loads((_run_dir(cluster, result) / "partition.json").read_text())["sizes"]
    for line in trained:  # a batch of 200 of the client's examples, or all it has
        assert line["examples"] == min(200, sizes[int(line["client"][6:])]), line
    errors = [entry["validation_error"] for entry in result["history"]]
    assert len(errors) == 6 and errors[-1] < min(errors[0], CHANCE), errors


@pytest.mark.parametrize("rule, codec, per_round", [
    ("trimmed_mean", "topk", 5), ("krum", "int8", 5)])
def test_delta_avg_clients_train_under_robust_rules_and_compression(holders, rule, codec,
                                                                    per_round):
    cluster, holder = holders
    result = cluster.train_json(
        *_federated(**{"clients.per_round": str(per_round)}),
        "--set", f"aggregation.rule={rule}", "--set", f"compression.up={codec}",
        "--set", "compression.topk_fraction=0.2", "--set", "run.rounds=4",
        "--run-id", f"{rule}-{codec}")
    trained = _check_placement(cluster, result, holder)
    assert [sum(1 for line in trained if line["round"] == r) for r in range(1, 5)] == \
        [per_round] * 4
    assert result["aggregation"] == rule and result["compression"]["up"] == codec
    weights, _ = load_model(_run_dir(cluster, result) / "model.npz")
    raw = sum(value.nbytes for value in weights.values())  # one update, uncompressed
    assert result["bytes_up"] < 0.75 * raw * len(trained), (result["bytes_up"], raw)
    errors = [entry["validation_error"] for entry in result["history"]]
    assert errors[-1] < CHANCE, errors


# ---------------------------------------------------------------- FL-GAN
FL_GAN_CLIENTS = {"run.algorithm": "fl_gan", "run.model": "mlpgan28-tiny",
                  "run.dataset": "mnist", "fl_gan.batch_size": "64", "fl_gan.lr": "0.005",
                  "clients.count": "8", "clients.partition": "dirichlet",
                  "clients.alpha": "1.0", "clients.per_round": "3",
                  "outputs.sample_every": "0", "outputs.checkpoint_every": "0",
                  "outputs.eval_every": "0", "run.rounds": "1"}


def test_fl_gan_averages_its_sampled_clients_gans_by_their_images(cluster):
    from tests.e2e.test_md_gan_cluster import PATIENT, sample_weighted_mean
    from thrift_trainer.training.algorithms.fl_gan import FLGan
    from thrift_trainer.training.run_config import load_run_config
    from thrift_trainer.training.units import UnitJob, UnitSpec

    low = cluster.add_node(0.0, "--clients", "0-3")
    high = cluster.add_node(0.0, "--clients", "4-7")
    holder = {str(low.port): range(0, 4), str(high.port): range(4, 8)}
    cluster.start_coordinator(2, "--store", str(cluster.workdir / "store.sqlite"), *PATIENT)
    result = cluster.train_json(*_with_sets([f"{k}={v}" for k, v in FL_GAN_CLIENTS.items()]),
                                timeout=300)
    trained = _check_placement(cluster, result, holder)
    sizes = json.loads((_run_dir(cluster, result) / "partition.json").read_text())["sizes"]
    assert len(trained) == 3 and len(set(sizes)) > 1, (trained, sizes)
    assert all(line["examples"] == sizes[int(line["client"][6:])] for line in trained)
    # what each holder computed, replayed here: the states weighted by the clients' images
    config = load_run_config(None, [f"{k}={v}" for k, v in FL_GAN_CLIENTS.items()]) \
        .to_spec().algorithm_config()
    algorithm = FLGan("mlpgan28-tiny", config, MNIST_DIR)
    initial = algorithm.initial_weights()
    outputs = [FLGan.run_unit(UnitJob("replay", 1, UnitSpec(line["client"], "", client=
                                                            line["client"]),
                                      algorithm.model, algorithm.config, initial), MNIST_DIR)
               for line in trained]
    assert [o.num_samples for o in outputs] == [line["examples"] for line in trained]
    expected = sample_weighted_mean([o.update for o in outputs],
                                    [o.num_samples for o in outputs])
    saved, _ = load_model(_run_dir(cluster, result) / "model.npz")
    for name, value in expected.items():
        if name.endswith("num_batches_tracked"):  # BatchNorm's counter: rounded
            value = np.rint(value)
        np.testing.assert_allclose(saved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(saved[name], initial[name]) for name in initial)  # it trained


# ---------------------------------------------------------------- MD-GAN
MD_GAN_CLIENTS = {"run.algorithm": "md_gan", "run.model": "mlpgan28-tiny",
                  "run.dataset": "mnist", "md_gan.workers": "2", "md_gan.batch_size": "32",
                  "md_gan.k": "1", "md_gan.lr": "0.005",
                  "md_gan.swap_every_epochs": "0.02",  # 125 iterations an epoch: every 2
                  "clients.count": "2", "outputs.sample_every": "0",
                  "outputs.checkpoint_every": "0", "outputs.eval_every": "0",
                  "run.rounds": "6"}


def test_md_gan_swaps_discriminators_between_the_holders_of_its_slots_clients(cluster):
    from tests.e2e.test_md_gan_cluster import PATIENT
    from thrift_trainer.training.algorithms.md_gan import MDGan
    from thrift_trainer.training.run_config import load_run_config

    first = cluster.add_node(0.0, "--clients", "0")
    second = cluster.add_node(0.0, "--clients", "1")
    holder = {str(first.port): range(0, 1), str(second.port): range(1, 2)}
    cluster.start_coordinator(2, "--store", str(cluster.workdir / "store.sqlite"), *PATIENT)
    overrides = [f"{k}={v}" for k, v in MD_GAN_CLIENTS.items()]
    result = cluster.train_json(*_with_sets(overrides), timeout=300)
    # slot n's units (md<round>-slot<n>) go to the holder of client n, every iteration
    trained = _check_placement(cluster, result, holder,
                               lambda unit_id: f"client{unit_id.rpartition('slot')[2]}")
    assert sorted((line["round"], line["client"]) for line in trained) == \
        [(r, f"client{n}") for r in range(1, 7) for n in (0, 1)], trained
    for period in (1, 2, 3):  # after iterations 2, 4 and 6, node to node
        cluster.coordinator.wait_for(
            rf"swap {period}: 2 discriminators moved \(0 relayed, 0 failed\)", timeout=30)
    sizes = json.loads((_run_dir(cluster, result) / "partition.json").read_text())["sizes"]
    assert sizes == [4000, 4000], sizes  # the 8,000 training images, dealt iid
    config = load_run_config(None, overrides).to_spec().algorithm_config()
    initial = MDGan("mlpgan28-tiny", config, MNIST_DIR).initial_weights()
    saved, _ = load_model(_run_dir(cluster, result) / "model.npz")
    assert any(not np.allclose(saved[name], initial[name]) for name in initial)  # G trained


def test_sync_sgd_on_node_resident_clients_takes_each_nodes_own_data(cluster):
    from tests.e2e.test_federated_clients import _own_letters

    roots = {"a": cluster.workdir / "data_a", "b": cluster.workdir / "data_b"}
    sizes = {"a": _own_letters(roots["a"], range(1, 2), lambda label: label < 13),
             "b": _own_letters(roots["b"], range(3, 8), lambda label: label >= 9)}
    nodes = {key: cluster.add_node(0.0, "--data-root", str(root), "--node-id", f"site-{key}")
             for key, root in roots.items()}
    cluster.start_coordinator(2)
    result = cluster.train_json(*_federated(**{
        "run.algorithm": "sync_sgd", "clients.placement": "nodes", "clients.count": "",
        "clients.partition": "", "clients.alpha": "", "clients.per_round": "",
        "sync_sgd.num_workunits_per_update": "2", "sync_sgd.images_per_work_unit": "500",
        "run.rounds": "3",
        **{item.split("=")[0]: "" for item in _overrides() if item.startswith("delta_avg.")}}))
    record = json.loads((_run_dir(cluster, result) / "partition.json").read_text())
    assert record["names"] == ["site-a", "site-b"] and record["sizes"] == [sizes["a"],
                                                                          sizes["b"]]
    lines = _lines(_run_dir(cluster, result))
    assert sorted((line["round"], line["client"], line["node"].rpartition(":")[2],
                   line["examples"]) for line in lines) == \
        [(r, f"site-{key}", str(nodes[key].port), min(500, sizes[key]))
         for r in (1, 2, 3) for key in "ab"], lines
    assert len(result["history"]) == 3


def test_sync_sgd_backs_up_a_slow_holders_client_only_on_another_holder(cluster):
    slow = cluster.add_node(0.0, "--clients", "0-5", "--slowdown", "20")
    fast = cluster.add_node(0.0, "--clients", "0-11")
    holder = {str(slow.port): range(0, 6), str(fast.port): range(0, 12)}
    cluster.start_coordinator(2, "--store", str(cluster.workdir / "store.sqlite"),
                              "--speculate-after", "0.2")
    dropped = {item.split("=")[0]: "" for item in _overrides() if item.startswith("delta_avg.")}
    result = cluster.train_json(
        *_federated(**{"run.algorithm": "sync_sgd"}, **dropped),
        "--set", "sync_sgd.num_workunits_per_update=4",  # every sampled client is needed
        "--set", "sync_sgd.images_per_work_unit=400", "--set", "run.rounds=6")
    trained = _check_placement(cluster, result, holder)
    assert [sum(1 for line in trained if line["round"] == r) for r in range(1, 7)] == [4] * 6
    attempts = _attempt_nodes(cluster.workdir / "store.sqlite", result["run_id"])
    both = [client for client, ports in attempts.items() if len(ports) == 2]
    assert both, attempts  # a slow holder's unit was backed up on the other holder


def test_sync_sgd_on_several_clients_of_a_node_equals_through_a_relay_and_two_workers(
        cluster):
    from devtools import local_cluster
    from tests.e2e.test_federated_clients import SITES, SITES_PLUGIN, four_sites

    roots, sizes = four_sites(cluster.workdir, clinic_files=range(5, 6))
    several = cluster.add_node(0.0, "--data-root", str(roots["a"]), *SITES_PLUGIN)
    clinic = cluster.add_node(0.0, "--data-root", str(roots["b"]), *SITES_PLUGIN)
    workers = cluster.add_node(0.0, "--data-root", str(roots["a"]), "--workers", "2",
                               *SITES_PLUGIN)
    group = local_cluster.write_nodes_file(cluster.workdir / "group.txt", [several])
    relay = local_cluster.start_node(cluster.workdir, "relay", 0.0, "--relay", str(group),
                                     *SITES_PLUGIN)
    cluster.nodes.append(relay)
    settings = dict(item.split("=", 1) for item in SITES if not item.startswith("delta_avg."))
    settings.update({"run.algorithm": "sync_sgd", "sync_sgd.num_workunits_per_update": "4",
                     "sync_sgd.images_per_work_unit": "600", "run.rounds": "2"})
    names = ["clinic", "ward-1", "ward-2", "ward-3"]
    weights = {}
    for run, wards in (("direct", several), ("relayed", relay), ("workers", workers)):
        cluster.start_coordinator(2, "--deterministic", "--data-root",
                                  str(roots["coordinator"]), *SITES_PLUGIN,
                                  nodes=[wards, clinic])
        result = cluster.train_json(*_with_sets([f"{k}={v}" for k, v in settings.items()]),
                                    "--run-id", run)
        cluster.coordinator.stop()
        lines = _lines(_run_dir(cluster, result))
        holder = {name: str((clinic if name == "clinic" else wards).port) for name in names}
        assert sorted((line["round"], line["client"], line["node"].rpartition(":")[2],
                       line["examples"]) for line in lines) == [
            (r, name, holder[name], min(600, sizes[name])) for r in (1, 2)
            for name in names], (run, lines)  # every client's gradient, on its holder
        attempts = _attempt_nodes(cluster.workdir / "runs" / "runs.db", run)
        assert attempts == {name: {holder[name]} for name in names}, (run, attempts)
        weights[run] = load_model(_run_dir(cluster, result) / "model.npz")[0]
    # behind the relay its member computed the wards' gradients whole; the node with two
    # workers split each into two shares, whose sample-weighted mean is the whole one
    # A node folds an info line repeated word for word within 10 s into a count, which it
    # writes out at the latest when it stops: stopped, its log holds every unit's end.
    several.stop()
    ends = re.findall(r"unit ward-\d round \d done[^\n]*?(?: \(repeated (\d+) times?[^\n]*)?\n",
                      several.log())  # a count's line stands for its repeats
    assert sum(int(repeats) if repeats else 1 for repeats in ends) >= 2 * 3 * 2, several.log()
    for run in ("relayed", "workers"):
        for name, value in weights["direct"].items():
            np.testing.assert_allclose(weights[run][name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{run}: {name}")
