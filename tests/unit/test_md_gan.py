"""MD-GAN in process: configuration, the generator's gradient, stale feedback, swaps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.md_gan import MDGan, resolve_k
from thrift_trainer.training.algorithms.md_gan_node import FEEDBACK, ITERATION, session_name
from thrift_trainer.training.algorithms.md_gan_swaps import derangement
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.gan_training import g_loss, noise
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.units import SessionMoved, UnitJob, UnitResult, UnitSpec, Weights

torch.set_num_threads(1)

MNIST = DEFAULT_DATA_ROOT / "mnist"
TINY = {"batch_size": 16, "batchnorm": False, "seed": 3}
TOLERANCE = 1e-5


def job(algorithm: MDGan, unit: UnitSpec, round_index: int, store: SessionStore,
        run_id: str = "run") -> UnitJob:
    return UnitJob(run_id, round_index, unit, algorithm.model, algorithm.config,
                   algorithm.unit_tensors(unit), sessions=store)


def run_iteration(algorithm: MDGan, round_index: int, store: SessionStore,
                  skip: tuple[int, ...] = ()) -> list[UnitResult]:
    """Every planned unit but ``skip`` through the node half: the round's results."""
    results = []
    for index, unit in enumerate(algorithm.plan_round(round_index)):
        if index not in skip:
            output = MDGan.run_unit(job(algorithm, unit, round_index, store), MNIST)
            algorithm.check_update(output.update, {})
            results.append(UnitResult(unit, output.update, output.num_samples))
    return results


def aggregate(algorithm: MDGan, results: list[UnitResult], round_index: int = 1) -> Weights:
    return algorithm.aggregate(round_index, algorithm.initial_weights(), results, [])


def discriminator(algorithm: MDGan, store: SessionStore, slot: int) -> torch.nn.Module:
    spec = gan_models.gan_spec(algorithm.model, algorithm.config["batchnorm"])
    _, d = gan_models.build_gan(spec)
    gan_models.numpy_to_state(d, store.export("run", session_name(slot)), "D.")
    return d


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


# ------------------------------------------------------------------ configuration


def test_registered_with_the_documented_defaults() -> None:
    assert get_algorithm("md_gan") is MDGan
    config = MDGan.check_config("dcgan28", {})
    assert config["workers"] == 4 and config["batch_size"] == 64 and config["k"] == "log2"
    assert (config["disc_steps"], config["swap_every_epochs"], config["swap"]) == (1, 1.0, True)
    assert (config["lr"], config["beta1"], config["beta2"]) == (2e-4, 0.5, 0.999)


def test_the_config_yaml_section_gives_the_algorithm_defaults() -> None:
    section = load_run_config(None, ["run.algorithm=md_gan", "run.model=dcgan28"])
    assert MDGan.check_config("dcgan28", section.algorithm_config()) == MDGan.check_config(
        "dcgan28", {})


@pytest.mark.parametrize(("workers", "k", "expected"), [
    (1, "log2", 1), (2, "log2", 1), (4, "log2", 2), (7, "log2", 2), (8, "log2", 3),
    (5, 3, 3)])
def test_k_is_an_integer_or_floor_log2_of_n(workers: int, k: int | str, expected: int) -> None:
    assert resolve_k(k, workers) == expected


@pytest.mark.parametrize(("config", "message"), [
    ({"k": "log"}, "'k' must be an integer >= 1 or \"log2\""),
    ({"k": 0}, "'k' must be an integer"),
    ({"workers": 2, "k": 3}, "'k' (3) must be at most 'workers' (2)"),
    ({"workers": 0}, "'workers' must be positive"),
    ({"lr": -1.0}, "'lr' must be positive"),
    ({"beta1": 1.0}, "'beta1' must be in [0, 1)"),
    ({"swap_every_epochs": 0}, "'swap_every_epochs' must be positive"),
    ({"disc_step": 2}, "unknown config key 'disc_step'"),
    ({"swap": "yes"}, "'swap' must be of type bool"),
])
def test_bad_configs_name_the_key(config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        MDGan.check_config("dcgan28-tiny", config)
    assert message in str(caught.value)


def test_too_many_workers_for_the_data_set_is_refused_on_the_coordinator() -> None:
    with pytest.raises(ConfigError, match="shards of 61 images, fewer than batch_size 64"):
        MDGan("dcgan28-tiny", {"workers": 130}, MNIST)


def test_an_unknown_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="not 'mlp'"):
        MDGan.check_config("mlp", {})


# ------------------------------------------------------------------ one iteration


@pytest.mark.parametrize("skip", [(), (1,)], ids=["every feedback", "one feedback lost"])
def test_averaged_feedback_gives_the_centralised_generator_gradient(skip: tuple[int, ...]
                                                                    ) -> None:
    """The generator's gradient from the nodes' feedback equals autograd through G and every
    node's D at once: per batch the mean over the discriminators that judged it, then the
    mean over batches (with every feedback in: 1/N sum over the N discriminators)."""
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 5, "k": 2}, MNIST)
    store = SessionStore()
    aggregate(algorithm, run_iteration(algorithm, 1, store, skip))
    got = [p.grad.clone() for p in algorithm.g.parameters()]

    spec = gan_models.gan_spec("dcgan28-tiny", batchnorm=False)
    g, _ = gan_models.build_gan(spec, seed=3)
    batches = [g(noise(spec.z_dim, 16, 3, 1, j)) for j in range(2)]
    judged: dict[int, list[int]] = {0: [], 1: []}
    for slot in range(5):
        if slot not in skip:
            judged[slot % 2].append(slot)
    loss = sum(sum(g_loss(discriminator(algorithm, store, slot)(batches[j]))
                   for slot in slots) / len(slots) for j, slots in judged.items()) / 2
    expected = torch.autograd.grad(loss, list(g.parameters()))
    worst = max(relative(a, e) for a, e in zip(got, expected, strict=True))
    assert worst < TOLERANCE, worst


def test_each_slot_gets_its_batches_and_k_1_generates_a_second_one() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 3, "k": 1}, MNIST)
    tensors = [algorithm.unit_tensors(u) for u in algorithm.plan_round(1)]
    assert all(np.array_equal(t["x_g"], tensors[0]["x_g"]) for t in tensors)
    assert all(np.array_equal(t["x_d"], tensors[0]["x_d"]) for t in tensors)
    assert not np.allclose(tensors[0]["x_g"], tensors[0]["x_d"])  # X_g and X_d differ
    two = MDGan("dcgan28-tiny", {**TINY, "workers": 3, "k": 2}, MNIST)
    t = [two.unit_tensors(u) for u in two.plan_round(1)]
    assert np.array_equal(t[0]["x_g"], t[1]["x_d"]) and np.array_equal(t[1]["x_g"], t[0]["x_d"])
    assert np.array_equal(t[2]["x_g"], t[0]["x_g"])  # slot n: batch n mod k


def test_planning_twice_gives_the_same_iteration() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    first = algorithm.plan_round(1)
    tensors = algorithm.unit_tensors(first[0])["x_g"]
    assert algorithm.plan_round(1) == first
    assert np.array_equal(algorithm.unit_tensors(first[0])["x_g"], tensors)


def test_feedback_tagged_with_another_iteration_is_dropped() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2, "k": 1}, MNIST)
    store = SessionStore()
    results = run_iteration(algorithm, 1, store)
    stale = [replace(r, update={**r.update, ITERATION: np.array([0])}) for r in results]
    with pytest.raises(ValueError, match="no feedback of iteration 1"):
        aggregate(algorithm, stale)
    # One stale unit among fresh ones: only the fresh one counts.
    first, second = results
    second.update[ITERATION] = np.array([7])
    before = [p.detach().clone() for p in algorithm.g.parameters()]
    aggregate(algorithm, [first, second])
    assert any(not torch.equal(b, p) for b, p in zip(before, algorithm.g.parameters(),
                                                      strict=True))


def test_a_node_refuses_a_late_duplicate_of_an_iteration_its_session_trained() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    store = SessionStore()
    units = algorithm.plan_round(1)
    MDGan.run_unit(job(algorithm, units[0], 1, store), MNIST)
    with pytest.raises(ConfigError, match="late duplicate"):
        MDGan.run_unit(job(algorithm, units[0], 1, store), MNIST)


def test_a_node_without_a_session_store_refuses_the_unit() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    unit = algorithm.plan_round(1)[0]
    bare = UnitJob("run", 1, unit, algorithm.model, algorithm.config, algorithm.unit_tensors(unit))
    with pytest.raises(ConfigError, match="node session"):
        MDGan.run_unit(bare, MNIST)


def test_wrong_update_shapes_are_refused() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    with pytest.raises(ValueError, match="feedback of shape"):
        algorithm.check_update({FEEDBACK: np.zeros((3, 1, 28, 28), np.float32),
                                ITERATION: np.array([1]),
                                "d_stats": np.zeros(2, np.float32)}, {})
    with pytest.raises(ValueError, match="holds feedback"):
        algorithm.check_update({FEEDBACK: np.zeros((16, 1, 28, 28), np.float32)}, {})


# ------------------------------------------------------------------ swaps


@pytest.mark.parametrize("n", range(2, 13))
def test_the_swap_permutation_is_a_derangement(n: int) -> None:
    for seed in range(200):
        perm = derangement(n, np.random.default_rng([seed, 1]))
        assert sorted(perm) == list(range(n))  # a permutation: nobody gets two
        assert all(perm[i] != i for i in range(n)), (seed, perm)  # nobody keeps its own
        assert perm == derangement(n, np.random.default_rng([seed, 1]))  # seeded


def test_a_derangement_of_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        derangement(1, np.random.default_rng(0))


class StoreMoves:
    """SessionMoves over in-process stores, one per node name."""

    def __init__(self, stores: Mapping[str, SessionStore], placement: Mapping[str, str]) -> None:
        self.stores = stores
        self.placement = dict(placement)
        self.moves: list[tuple[str, str, str, str, int]] = []

    def move(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        tensors = self.stores[source].export("run", session)
        self.stores[target].stage("run", target_session, swap_id, tensors)
        self.moves.append((source, session, target, target_session, swap_id))
        return SessionMoved(bytes=sum(a.nbytes for a in tensors.values()), relayed=False)


def test_a_swap_moves_each_d_to_its_slot_and_takes_effect_at_the_next_iteration() -> None:
    algorithm = MDGan("dcgan28-tiny", {"batch_size": 16, "seed": 3, "workers": 3, "k": 1,
                                       "swap_every_epochs": 1 / 166}, MNIST)
    assert algorithm.swap_period == 1  # 2,666-image shards of 16: 166 iterations an epoch
    stores = {"a": SessionStore(), "b": SessionStore()}
    where = {0: "a", 1: "b", 2: "a"}
    units = algorithm.plan_round(1)
    results = []
    for index, unit in enumerate(units):
        out = MDGan.run_unit(job(algorithm, unit, 1, stores[where[index]]), MNIST)
        results.append(UnitResult(unit, out.update, out.num_samples))
    aggregate(algorithm, results)
    before = {slot: stores[where[slot]].export("run", session_name(slot)) for slot in range(3)}
    moves = StoreMoves(stores, {u.unit_id: where[i] for i, u in enumerate(units)})
    algorithm.after_round(1, moves)

    perm = algorithm.swap_stats.log[-1]["perm"]
    assert [(m[1], m[3]) for m in moves.moves] == [
        (session_name(i), session_name(perm[i])) for i in range(3)]
    assert algorithm.swap_stats.moved == 3 and algorithm.swaps_done == 1
    assert algorithm.swap_stats.model_bytes == 3 * algorithm.model_bytes
    assert algorithm.swap_stats.optimizer_bytes == 3 * algorithm.optimizer_bytes > 0
    for slot in range(3):  # staged only: the trained state is unchanged until a unit comes
        after = stores[where[slot]].export("run", session_name(slot))
        assert all(np.array_equal(after[k], before[slot][k]) for k in after)
    # The next iteration's units carry the swap id and install the staged D first.
    units = algorithm.plan_round(2)
    assert [u.preferred_node for u in units] == [where[i] for i in range(3)]
    target = perm[0]
    with stores[where[target]].use("run", session_name(target)) as session:
        staged = session.take_staged(1)
        session.staged[1] = staged
    assert all(np.array_equal(staged[k], before[0][k]) for k in before[0])
    assert any(k.startswith("adam.") for k in staged) and any("running_var" in k for k in staged)


def test_no_swap_with_one_worker_or_when_turned_off() -> None:
    for config in ({"workers": 1}, {"workers": 2, "swap": False}):
        algorithm = MDGan("dcgan28-tiny", {**TINY, **config, "swap_every_epochs": 0.001},
                          MNIST)
        moves = StoreMoves({}, {})
        algorithm.after_round(algorithm.swap_period, moves)
        assert moves.moves == [] and algorithm.swaps_done == 0


def test_a_failed_move_leaves_that_d_behind_and_the_swap_goes_on() -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2, "swap_every_epochs": 0.001},
                      MNIST)
    moves = StoreMoves({}, {"md1-slot0": "a"})  # slot 1 never ran anywhere
    algorithm.after_round(1, moves)
    assert algorithm.swap_stats.failed == 2 and algorithm.swaps_done == 1


def test_state_dict_restores_the_generator_its_adam_and_the_swap_count(tmp_path: Path) -> None:
    algorithm = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    aggregate(algorithm, run_iteration(algorithm, 1, SessionStore()))
    algorithm.swaps_done = 3
    np.savez(tmp_path / "state.npz", **algorithm.state_dict())
    with np.load(tmp_path / "state.npz") as saved:
        state = {k: saved[k] for k in saved.files}
    resumed = MDGan("dcgan28-tiny", {**TINY, "workers": 2}, MNIST)
    resumed.load_state_dict(state)
    assert resumed.swaps_done == 3
    for a, b in zip(algorithm.g.parameters(), resumed.g.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(algorithm.opt_g.state[a]["exp_avg_sq"],
                           resumed.opt_g.state[b]["exp_avg_sq"])
