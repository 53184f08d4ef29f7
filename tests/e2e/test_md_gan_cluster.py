"""MD-GAN and FL-GAN through real node and coordinator processes on loopback: swaps node
to node and relayed, a short run that learns, a node killed mid-run, sessions dropped."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from devtools.local_cluster import REPO, start_pull_node
from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.thrift_client import pushed_node
from thrift_trainer.engine.session_moves import NodeSessions
from thrift_trainer.engine.tasks import Task, TaskStatus
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.algorithms.md_gan_node import Discriminator
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.outputs import gan_metrics
from thrift_trainer.training.outputs.model_file import load_model
from thrift_trainer.training.units import UnitJob, UnitSpec
from thrift_trainer.wire.tensor_codec import wire_to_dict

torch.set_num_threads(1)

MNIST = DEFAULT_DATA_ROOT / "mnist"
MD_GAN = str(REPO / "configs" / "md_gan_mnist.yaml")
# The tiny DCGAN learns fast enough to show in a few dozen iterations at a high lr.
TINY_RUN = ["--set", "run.model=dcgan28-tiny", "--set", "md_gan.workers=2",
            "--set", "md_gan.batch_size=32", "--set", "md_gan.k=1", "--set", "md_gan.lr=0.005",
            "--set", "md_gan.swap_every_epochs=0.1",  # 125 iterations an epoch: every 12
            "--set", "outputs.sample_every=0", "--set", "outputs.checkpoint_every=0"]
EVAL_N = 500
# A node's first GAN unit imports torch; on a busy 2-core machine that alone can pass the
# default 30 s deadline, and a reclaimed unit would blur the counts these tests check.
PATIENT = ("--deadline-floor", "120")
FL_GAN_CONFIG = {"workers": 2, "batch_size": 64, "lr": 0.005}  # learns in a few rounds
FL_GAN = ["--config", str(REPO / "configs" / "fl_gan_mnist.yaml"), "--set",
          "run.model=dcgan28-tiny", "--set", "outputs.sample_every=0", "--set",
          "outputs.checkpoint_every=0"]
for key, value in FL_GAN_CONFIG.items():
    FL_GAN += ["--set", f"fl_gan.{key}={value}"]


def handles(cluster, count: int = 2) -> list[NodeHandle]:
    procs = [cluster.add_node(0.0) for _ in range(count)]
    return [pushed_node(i, NodeAddress("127.0.0.1", p.port), rpc_timeout=180.0,
                        connect_timeout=3.0) for i, p in enumerate(procs)]


def train(node: NodeHandle, algorithm: MDGan, unit: UnitSpec, round_index: int) -> None:
    result = node.train(Task(
        run_id="run", round=round_index, unit_id=unit.unit_id,
        attempt=1, algorithm="md_gan", model=algorithm.model, dataset="mnist",
        unit_path=unit.unit_path, config_json=json.dumps(algorithm.config),
        weights=algorithm.unit_tensors(unit), scheduling_policy=2))
    assert result.status == TaskStatus.COMPLETED, result.message


def export(node: NodeHandle, session: str) -> dict[str, np.ndarray]:
    tensors = node.client.export_session("run", session)
    return {k: v.copy() for k, v in wire_to_dict(tensors).items()}


def replay(algorithm: MDGan, unit: UnitSpec, start: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What slot 1's unit of iteration 2 makes of a D that starts from ``start``."""
    store = SessionStore()
    with store.use("run", "d1") as session:
        session.state = Discriminator(algorithm.spec, algorithm.config, 1)
        session.state.load(start)
        session.last_round = 1
    MDGan.run_unit(UnitJob("run", 2, unit, algorithm.model, algorithm.config,
                           algorithm.unit_tensors(unit), sessions=store), MNIST)
    return store.export("run", "d1")


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return sorted(a) == sorted(b) and all(np.allclose(a[k], b[k], rtol=1e-5, atol=1e-7)
                                          for k in a)


@pytest.mark.parametrize("relayed", [False, True], ids=["node to node", "relayed"])
def test_a_swap_moves_parameters_buffers_and_adam_state_between_nodes(cluster,
                                                                      relayed: bool) -> None:
    a, b = handles(cluster)
    algorithm = MDGan("dcgan28-tiny", {"workers": 2, "batch_size": 16, "k": 1, "seed": 5},
                      MNIST)
    units = algorithm.plan_round(1)
    train(a, algorithm, units[0], 1)  # slot 0's D lives on a, slot 1's on b
    train(b, algorithm, units[1], 1)
    d0, d1 = export(a, "d0"), export(b, "d1")
    assert any("running_mean" in k for k in d0) and any(k.startswith("adam.") for k in d0)

    sessions = NodeSessions("run", [a, b], {}, cannot_dial=lambda node: relayed and node is a)
    moved = sessions.move(a.name, "d0", b.name, "d1", swap_id=1)
    assert moved.relayed is relayed
    assert moved.bytes == algorithm.model_bytes + algorithm.optimizer_bytes
    assert same(export(b, "d1"), d1)  # staged: the trained state has not changed yet

    algorithm.swaps_done = 1  # the next iteration's units carry swap id 1
    units = algorithm.plan_round(2)
    train(b, algorithm, units[1], 2)
    after = export(b, "d1")
    assert same(after, replay(algorithm, units[1], d0))  # it trained slot 0's D, exactly
    assert not same(after, replay(algorithm, units[1], d1))


def initial_fid(model: str, seed: int) -> float:
    g, _ = gan_models.build_gan(gan_models.gan_spec(model), seed=seed)
    images = gan_models.sample_images(g, EVAL_N, seed=gan_metrics.SCORE_SEED)
    return gan_metrics.score_images(images, EVAL_N).fid_features


@pytest.fixture(scope="module")
def two_nodes(module_cluster):
    """Two nodes and a patient coordinator that the short MD-GAN run and the FL-GAN runs
    train through, each under a run id of its own (only the MD-GAN run swaps, so the
    coordinator's swap lines are its own)."""
    for _ in range(2):
        module_cluster.add_node(0.0)
    module_cluster.start_coordinator(2, *PATIENT)
    return module_cluster


def test_a_short_two_node_run_improves_fid_and_drops_its_sessions(two_nodes) -> None:
    cluster, nodes = two_nodes, two_nodes.nodes
    result = cluster.train_json("--config", MD_GAN, *TINY_RUN, "--set", "run.rounds=40",
                                "--set", "outputs.eval_every=40",
                                "--set", f"outputs.eval_n={EVAL_N}",
                                "--run-id", "md-gan-short", timeout=300)
    assert result["rounds"] == 40
    start, end = initial_fid("dcgan28-tiny", 1), result["history"][-1]["fid_features"]
    seconds = sorted(h["seconds"] for h in result["history"][1:-1])  # no start-up, no scoring
    print(f"\nMD-GAN 2 nodes, 40 iterations: FID {start:.0f} -> {end:.0f}, "
          f"median iteration {seconds[len(seconds) // 2]:.3f} s")
    assert end < 0.75 * start
    cluster.coordinator.wait_for(r"swap 3: 2 discriminators moved \(0 relayed, 0 failed\)")
    for node in nodes:  # the run's sessions were dropped on every node at its end
        node.wait_for(r"dropped 1 sessions of run md-gan-short")
    assert sum(n["accepted"] for n in result["nodes"]) == 80


def test_md_gan_survives_a_node_killed_mid_run(cluster) -> None:
    cluster.add_node(0.0)
    doomed = cluster.add_node(0.0, "--crash-after-units", "7")
    cluster.start_coordinator(2, *PATIENT)
    result = cluster.train_json("--config", MD_GAN, *TINY_RUN, "--set", "run.rounds=30",
                                "--set", "outputs.eval_every=30",
                                "--set", f"outputs.eval_n={EVAL_N}", timeout=300)
    assert not doomed.alive()
    assert result["rounds"] == 30
    crashed = next(n for n in result["nodes"] if n["node"].endswith(f":{doomed.port}"))
    survivor = next(n for n in result["nodes"] if n is not crashed)
    assert crashed["failed"] >= 1 and crashed["accepted"] == 7
    # Every later unit; the crashed node's slot went on with a D started afresh.
    assert survivor["accepted"] == 60 - 7
    # A swap after the crash still moves both discriminators (both live on the survivor).
    cluster.coordinator.wait_for(r"swap 2: 2 discriminators moved \(0 relayed, 0 failed\)")


def sample_weighted_mean(states: list[dict[str, np.ndarray]],
                         samples: list[int]) -> dict[str, np.ndarray]:
    """The mean of whole states weighted by samples, in float64, each tensor back in its
    dtype (an integer one, BN's batch counter, rounded)."""
    mean = {}
    for name, first in states[0].items():
        value = sum(n * s[name].astype(np.float64) for s, n in zip(states, samples, strict=True))
        value /= sum(samples)
        mean[name] = (np.rint(value) if np.issubdtype(first.dtype, np.integer)
                      else value).astype(first.dtype)
    return mean


def test_fl_gan_takes_the_sample_weighted_mean_of_the_states_its_nodes_return(
        two_nodes) -> None:
    cluster = two_nodes
    result = cluster.train_json(*FL_GAN, "--set", "run.rounds=1", "--set",
                                "outputs.eval_every=0", "--run-id", "averaged", timeout=300)
    assert result["rounds"] == 1
    # what each node computes for its unit of round 1, replayed here from the same inputs
    algorithm = FLGan("dcgan28-tiny", FL_GAN_CONFIG, MNIST)
    initial = algorithm.initial_weights()
    outputs = [FLGan.run_unit(UnitJob("averaged", 1, unit, algorithm.model, algorithm.config,
                                      initial), MNIST) for unit in algorithm.plan_round(1)]
    expected = sample_weighted_mean([o.update for o in outputs],
                                    [o.num_samples for o in outputs])
    saved, _ = load_model(cluster.workdir / "runs" / "averaged" / "model.npz")
    assert sorted(saved) == sorted(expected)
    for name, value in expected.items():
        assert saved[name].dtype == value.dtype, name
        np.testing.assert_allclose(saved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(saved[name], initial[name]) for name in initial)  # it trained


def test_fl_gan_learns_through_two_nodes(two_nodes) -> None:
    result = two_nodes.train_json(*FL_GAN, "--set", "run.rounds=4", "--set",
                                  "outputs.eval_every=1", "--set", f"outputs.eval_n={EVAL_N}",
                                  "--run-id", "fl-gan-learns", timeout=300)
    assert result["rounds"] == 4
    fids = [h["fid_features"] for h in result["history"]]
    # about 1,350 after round 1 and 230 after round 4 (and 2,780 untrained)
    assert len(fids) == 4 and fids[-1] < 0.5 * fids[0], fids


def test_md_gan_swaps_reach_a_pull_node_through_its_leases(cluster) -> None:
    pushed = cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, *PATIENT, nodes=[pushed])
    pulled = start_pull_node(cluster.workdir, "laptop", coordinator.port)
    cluster.nodes.append(pulled)  # stopped with the cluster
    coordinator.wait_for(r"node pull:laptop registered")
    result = cluster.train_json("--config", MD_GAN, *TINY_RUN, "--set", "run.rounds=26",
                                "--set", "outputs.eval_every=0", timeout=300)
    assert result["rounds"] == 26
    by_node = {n["node"]: n for n in result["nodes"]}
    assert by_node["pull:laptop"]["accepted"] > 0 and by_node["pull:laptop"]["pull"]
    # Every move has a pull-node end, so both discriminators go through the coordinator.
    coordinator.wait_for(r"swap 2: 2 discriminators moved \(2 relayed, 0 failed\)")
    pulled.wait_for(r"dropped 1 sessions of run")
