"""A private run's noise key (training/privacy/noise_key.py): every random draw of its
mechanism (the Gaussian noise, the adaptive clip's count noise, the client draw) is keyed
by a secret the coordinator makes, not by the run's public seed; the key is in the
checkpoint and in nothing the nodes or the requester get."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from devtools.simulation.scheduler import SimRuntime
from tests.unit.test_privacy import _prepare as prepare_config
from thrift_trainer.coordinator.checkpoint import (
    Checkpoint,
    CheckpointError,
    noise_key,
    save_checkpoint,
)
from thrift_trainer.coordinator.run_setup import describe
from thrift_trainer.engine import runtime
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.clients import sampling
from thrift_trainer.training.privacy import adaptive, mechanism
from thrift_trainer.training.privacy import noise_key as noise_keys
from thrift_trainer.training.run_config import load_run_config

DATA = Path(__file__).resolve().parents[2] / "data"
FEDERATED = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
             "delta_avg.local_optimizer=sgd", "clients.count=10", "clients.per_round=3"]
PRIVATE = [*FEDERATED, "privacy.clip=1.0", "privacy.noise_multiplier=1.1"]
POISSON = [*PRIVATE, "clients.sampling=poisson"]


def _prepare(overrides: list[str]):
    return prepare_config(load_run_config(None, overrides), rounds=3)


def _one_round(algorithm, round_index: int = 1) -> dict[str, np.ndarray]:
    """The change a round without any client's update makes: its noise alone, over the
    expected clients."""
    weights = algorithm.initial_weights()
    after = algorithm.aggregate(round_index, weights, [], [])
    return {name: np.asarray(after[name], np.float64) - weights[name] for name in weights}


def _seed_noise(like: dict[str, np.ndarray], std: float, seed: int,
                round_index: int) -> dict[str, np.ndarray]:
    """The noise a generator of the public (seed, round) alone would draw: anyone who knows
    the request can compute it."""
    generator = np.random.default_rng([mechanism.NOISE_TAG, seed, round_index])
    return {name: generator.normal(0.0, std, size=np.shape(like[name])) for name in sorted(like)}


def test_two_private_runs_of_one_seed_get_their_own_keys_and_noise() -> None:
    first, second = (_prepare(PRIVATE).algorithm for _ in range(2))
    assert first.config["seed"] == second.config["seed"]
    assert len(first.noise_key) == noise_keys.KEY_BYTES
    assert first.noise_key != second.noise_key
    one, two = _one_round(first), _one_round(second)
    assert all(not np.allclose(one[name], two[name]) for name in one)
    again = _prepare(PRIVATE).algorithm
    again.use_noise_key(first.noise_key)  # as a resume restores it from the checkpoint
    same = _one_round(again)
    for name in one:
        np.testing.assert_array_equal(same[name], one[name], err_msg=name)


def test_the_noise_is_the_keys_and_cannot_be_drawn_again_from_the_seed() -> None:
    algorithm = _prepare(PRIVATE).algorithm
    change = _one_round(algorithm, round_index=2)
    expected = algorithm.privacy_sampling().expected
    weights = algorithm.initial_weights()
    keyed = mechanism.noise(weights, 1.1 * 1.0, algorithm.noise_key, 2)
    public = _seed_noise(weights, 1.1 * 1.0, algorithm.config["seed"], 2)
    for name in change:
        np.testing.assert_allclose(change[name], keyed[name] / expected, atol=1e-6,
                                   err_msg=name)
        # what is left once the public seed's noise is taken off is still noise of z x clip
        left = (change[name] - public[name] / expected) * expected
        assert np.std(left) > 1.1, name


def test_the_clients_a_private_run_draws_are_keyed_not_the_seeds() -> None:
    for overrides in (PRIVATE, POISSON):
        first, second = (_prepare(overrides).algorithm for _ in range(2))
        names = [u.client for u in first.client_units()]
        settings = first._plan.clients
        rounds = range(1, 31)
        drawn = [[u.client for u in first.plan_round(r)] for r in rounds]
        assert drawn != [[u.client for u in second.plan_round(r)] for r in rounds]
        assert drawn != [settings.sampled(r, first.config["seed"], names) for r in rounds]
        assert drawn == [settings.sampled(r, first.config["seed"], names, first.noise_key)
                         for r in rounds]
        if overrides is PRIVATE:  # fixed sampling: the target count, every round
            assert {len(clients) for clients in drawn} == {3}


def test_a_run_without_privacy_draws_by_the_seed_as_it_always_did() -> None:
    algorithm = _prepare([*FEDERATED, "clients.sampling=poisson"]).algorithm
    assert algorithm.noise_key is None
    text = json.dumps(["poisson", 4, 2, "client3"]).encode()
    plain = int.from_bytes(hashlib.sha256(text).digest()[:8], "little")
    assert sampling.client_key("poisson", 4, 2, "client3") == plain
    assert sampling.client_key("poisson", 4, 2, "client3", bytes(32)) != plain


def test_a_private_run_without_its_key_neither_draws_nor_adds_noise() -> None:
    config = load_run_config(None, PRIVATE)
    algorithm = DeltaAveraging("mlp_classifier", config.to_spec().algorithm_config(),
                               DATA / "letters", "letters")
    with pytest.raises(RuntimeError, match="noise key"):
        algorithm.plan_round(1)
    weights = algorithm.initial_weights()
    with pytest.raises(RuntimeError, match="noise key"):
        algorithm.aggregate(1, weights, [], [])
    with pytest.raises(noise_keys.NoiseKeyError):
        algorithm.use_noise_key(b"short")
    with pytest.raises(noise_keys.NoiseKeyError):
        adaptive.fraction_under([], 1.0, 1.0, 3.0, None, 1)  # type: ignore[arg-type]


def test_the_key_is_in_no_config_a_node_or_the_requester_gets() -> None:
    setup = _prepare(POISSON)
    key = setup.algorithm.noise_key
    told = [setup.node_config_json, setup.request.config_json,
            json.dumps(describe(setup, 0, ["n1"]), default=str)]
    for text in told:
        assert "noise_key" not in text
        assert key.hex() not in text and key.hex().upper() not in text
        assert str(list(key))[1:-1] not in text
    assert "noise_key" not in json.dumps(setup.algorithm.config, default=str)


def test_the_key_is_in_the_checkpoint_and_read_back_from_the_run_folder(tmp_path) -> None:
    algorithm = _prepare(PRIVATE).algorithm
    weights = algorithm.initial_weights()
    save_checkpoint(tmp_path, Checkpoint(1, weights, algorithm.state_dict(), None), {})
    assert noise_key(tmp_path) == algorithm.noise_key
    plain = _prepare(FEDERATED).algorithm
    save_checkpoint(tmp_path, Checkpoint(1, weights, plain.state_dict(), None), {})
    with pytest.raises(CheckpointError, match="holds no noise key"):
        noise_key(tmp_path)


def test_a_simulated_private_run_holds_one_key_in_every_simulation_of_it() -> None:
    """The runtime makes the key: the system's entropy in production; in a simulation, a
    function of its label alone, so that a plan and its run without faults (whose final
    weights must be equal) hold the same key, whatever the scheduler's seed."""
    def key_of(seed: int) -> bytes:
        found = []
        sim = SimRuntime(seed)
        with runtime.installed(sim):
            sim.run(lambda: found.append(_prepare(PRIVATE).algorithm.noise_key), 1e6)
        return found[0]

    simulated = key_of(3)
    assert len(simulated) == noise_keys.KEY_BYTES
    assert key_of(4) == simulated != _prepare(PRIVATE).algorithm.noise_key
