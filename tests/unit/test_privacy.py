"""Client-level differential privacy (training/privacy/): the clipping and noise of
DP-FedAvg, Poisson sampling, epsilon against dp-accounting's own, and the runs refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dp_accounting  # requirements-dev.txt installs it (the privacy extra)
import numpy as np
import pytest

from thrift_trainer.coordinator.privacy_budget import PrivacyBudget
from thrift_trainer.coordinator.records import InvalidRun, RunRequest
from thrift_trainer.coordinator.request_checks import RequestLimits
from thrift_trainer.coordinator.run_setup import prepare
from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.privacy import accounting, mechanism
from thrift_trainer.training.privacy.accounting import Sampling
from thrift_trainer.training.privacy.settings import settings_from
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.schema import PrivacySettings

DATA = Path(__file__).resolve().parents[2] / "data"
FEDERATED = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
             "delta_avg.local_optimizer=sgd", "clients.count=10", "clients.per_round=3"]
PRIVATE = [*FEDERATED, "privacy.clip=1.0", "privacy.noise_multiplier=1.1"]


# ------------------------------------------------------------------ clipping
def test_an_update_above_the_bound_is_scaled_to_it_over_all_its_tensors():
    update = {"a": np.full((3, 4), 2.0, dtype=np.float32), "b": np.array([6.0, 8.0])}
    norm = np.sqrt(12 * 4.0 + 100.0)
    out = mechanism.clipped(update, 1.5)
    assert mechanism.global_norm(out) == pytest.approx(1.5, rel=1e-12)
    np.testing.assert_allclose(out["b"], update["b"] * 1.5 / norm)
    np.testing.assert_allclose(out["a"], update["a"] * 1.5 / norm)


def test_an_update_within_the_bound_is_left_as_it_is():
    update = {"a": np.array([0.3, -0.4])}
    np.testing.assert_array_equal(mechanism.clipped(update, 1.0)["a"], update["a"])
    assert mechanism.global_norm(mechanism.clipped({"z": np.zeros(3)}, 1.0)) == 0.0


def test_without_noise_the_mean_is_the_clipped_sum_over_the_expected_clients():
    like = {"w": np.zeros(2, dtype=np.float32)}
    updates = [{"w": np.array([3.0, 4.0])}, {"w": np.array([0.1, 0.2])}]
    mean = mechanism.private_mean(updates, like, 1.0, 0.0, 4.0, seed=1, round_index=1)
    np.testing.assert_allclose(mean["w"], (np.array([0.6, 0.8]) + [0.1, 0.2]) / 4.0,
                               rtol=1e-6)
    assert mean["w"].dtype == np.float32  # the model's dtype


# --------------------------------------------------------------------- noise
def test_the_noise_has_standard_deviation_z_times_clip_and_is_seeded_by_round():
    like = {"big": np.zeros((400, 500), dtype=np.float64), "small": np.zeros(7)}
    clip, z = 0.7, 1.3
    noised = mechanism.private_mean([], like, clip, z, 1.0, seed=5, round_index=3)
    values = np.concatenate([v.ravel() for v in noised.values()])
    # 200,007 draws: the sample std is within 1% of sigma with overwhelming probability
    # (its relative standard error is about 1 / sqrt(2n) = 0.16%)
    assert np.std(values) == pytest.approx(z * clip, rel=0.01)
    assert abs(np.mean(values)) < 5 * z * clip / np.sqrt(values.size)
    again = mechanism.private_mean([], like, clip, z, 1.0, seed=5, round_index=3)
    other = mechanism.private_mean([], like, clip, z, 1.0, seed=5, round_index=4)
    np.testing.assert_array_equal(noised["big"], again["big"])
    assert not np.array_equal(noised["big"], other["big"])


def test_the_noise_is_divided_by_the_expected_number_of_clients():
    like = {"w": np.zeros(100_000)}
    one = mechanism.private_mean([], like, 2.0, 1.0, 1.0, seed=1, round_index=1)["w"]
    ten = mechanism.private_mean([], like, 2.0, 1.0, 10.0, seed=1, round_index=1)["w"]
    np.testing.assert_allclose(ten, one / 10.0)
    assert np.std(one) == pytest.approx(2.0, rel=0.02)


# ---------------------------------------------------------- Poisson sampling
def test_poisson_sampling_is_reproducible_per_round_and_has_the_expected_size():
    settings = ClientsSettings(count=200, per_round=20, sampling="poisson")
    names = settings.names()
    assert settings.q(200) == pytest.approx(0.1)
    first = settings.sampled(7, 3, names)
    assert first == settings.sampled(7, 3, list(reversed(names)))  # order of no matter
    assert first != settings.sampled(8, 3, names)
    sizes = [len(settings.sampled(r, 3, names)) for r in range(1, 301)]
    # Binomial(200, 0.1) per round: the mean of 300 rounds is 20 within 5 standard errors
    assert abs(np.mean(sizes) - 20) < 5 * np.sqrt(200 * 0.1 * 0.9 / 300)
    assert len(set(sizes)) > 3  # the size varies, unlike fixed sampling


def test_poisson_rounds_wait_for_every_client_drawn():
    config = load_run_config(None, [*FEDERATED, "clients.sampling=poisson"])
    setup = _prepare(config)
    plan = setup.algorithm._plan
    for round_index in (1, 2, 3):
        units = setup.algorithm.plan_round(round_index)
        assert setup.algorithm.quorum(len(units)) == len(units)
        assert [u.client for u in units] == plan.clients.sampled(
            round_index, 1, [u.unit_id for u in plan.units])


# ---------------------------------------------------------------- accounting
def _reference(settings: PrivacySettings, sampling: Sampling, rounds: int) -> float:
    """Epsilon from dp-accounting directly: the round's event composed once per round."""
    gaussian = dp_accounting.GaussianDpEvent(settings.noise_multiplier)
    if sampling.kind == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(sampling.per_round / sampling.count,
                                                    gaussian)
    else:
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            sampling.count, sampling.per_round, gaussian)
    if settings.accountant == "pld":
        spent = dp_accounting.pld.PLDAccountant()
    else:
        spent = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
            if sampling.kind == "fixed" else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for _ in range(rounds):
        spent.compose(event)
    return spent.get_epsilon(settings.delta)


@pytest.mark.parametrize("kind, name", [("fixed", "rdp"), ("poisson", "rdp"),
                                        ("poisson", "pld")])
def test_epsilon_equals_dp_accountings_own_to_three_digits(kind, name):
    settings = PrivacySettings(clip=1.0, noise_multiplier=1.2, delta=1e-5, accountant=name)
    sampling = Sampling(kind, 100, 10)
    for rounds in (1, 4) if name == "rdp" else (3,):  # PLD's take seconds each
        mine = accounting.epsilon(settings, sampling, rounds)
        assert float(f"{mine:.3g}") == float(f"{_reference(settings, sampling, rounds):.3g}")
    assert accounting.epsilon(settings, sampling, 0) == 0.0


def test_epsilon_grows_with_rounds_and_target_gives_the_rounds_that_fit():
    settings = PrivacySettings(clip=1.0, noise_multiplier=1.0, target_epsilon=2.0)
    sampling = Sampling("poisson", 50, 5)
    fit = accounting.rounds_within(settings, sampling, 1000)
    assert accounting.epsilon(settings, sampling, fit) <= 2.0
    assert accounting.epsilon(settings, sampling, fit + 1) > 2.0
    with pytest.raises(ConfigError, match=f"; {fit} rounds fit"):
        accounting.check_plan(settings, sampling, fit + 1)
    accounting.check_plan(settings, sampling, fit)


def test_the_budget_stops_a_run_before_the_round_past_the_target():
    config = load_run_config(None, [*PRIVATE, "privacy.target_epsilon=6.0"])
    budget = PrivacyBudget.of(_prepare(config).algorithm)
    fit = accounting.rounds_within(budget.settings, budget.sampling, 20)
    assert fit == 4  # epsilon 4.1 after 2 rounds of 3 of 10 clients at z 1.1, 6.6 after 5
    budget.check_round(fit, [])
    with pytest.raises(RoundFailed, match=f"round {fit + 1} would spend epsilon"):
        budget.check_round(fit + 1, [])
    assert budget.figures(2)["epsilon"] == accounting.epsilon(budget.settings,
                                                              budget.sampling, 2)


# ------------------------------------------------------------------- settings
@pytest.mark.parametrize("raw, why", [
    ({"clip": -1.0}, "privacy.clip must be a finite number >= 0"),
    ({"clip": 1.0, "delta": 1.5}, "privacy.delta must be in \\(0, 1\\)"),
    ({"clip": 1.0, "accountant": "gdp"}, "privacy.accountant must be one of rdp, pld"),
    ({"noise_multiplier": 1.0}, "set privacy.clip > 0 to turn privacy on"),
    ({"clip": 1.0, "epsilon": 1.0}, "unknown key 'privacy.epsilon'"),
])
def test_bad_privacy_settings_are_refused_naming_the_key(raw, why):
    with pytest.raises(ConfigError, match=why):
        settings_from(raw)


def test_a_run_without_privacy_sends_what_it_sent_before():
    spec = load_run_config(None, FEDERATED).to_spec()
    config = spec.config_dict(with_schedule=True)
    assert "privacy" not in config and "sampling" not in config["clients"]
    assert "privacy" in load_run_config(None, PRIVATE).to_spec().config_dict()


# ------------------------------------------------------------------ refusals
def _prepare(config, rounds: int = 2, outputs: dict | None = None):
    spec = config.to_spec()
    request = RunRequest("r1", spec.algorithm, spec.model, spec.dataset, rounds,
                         json.dumps(config.algorithm_config()),
                         json.dumps(outputs) if outputs else None)
    return prepare(request, DATA, RequestLimits(), deterministic=False)


@pytest.mark.parametrize("overrides, why", [
    (["privacy.clip=1.0"], "privacy: client-level privacy needs federated clients"),
    (["run.model=mlp_classifier", "data.format=letters", "privacy.clip=1.0"],
     "privacy: client-level privacy needs federated clients"),
    ([*PRIVATE, "aggregation.rule=median"], "privacy: aggregation.rule median does not sum"),
    ([*PRIVATE, "clients.over_select=1.5"], "privacy: clients.over_select drops"),
    ([*PRIVATE, "schedule.mode=buffered"], "privacy: DP-FedAvg runs sync rounds"),
    ([*PRIVATE, "run.algorithm=sync_sgd", "sync_sgd.num_workunits_per_update=3",
      "sync_sgd.units_per_iteration=3"], "privacy: sync_sgd has no client-level privacy"),
    ([*PRIVATE, "privacy.accountant=pld"], "pld accounts Poisson sampling only"),
    ([*PRIVATE, "privacy.target_epsilon=0.5"], "2 rounds would spend epsilon .* rounds fit"),
    ([*PRIVATE, "privacy.noise_multiplier=0", "privacy.target_epsilon=10"],
     "would spend epsilon inf"),
])
def test_what_dp_fedavg_cannot_make_private_is_refused_before_round_1(overrides, why):
    with pytest.raises(InvalidRun, match=why):
        _prepare(load_run_config(None, overrides))


def test_a_private_run_checkpoints_every_round():
    with pytest.raises(InvalidRun, match="privacy: outputs.checkpoint_every must be 1"):
        _prepare(load_run_config(None, PRIVATE), outputs={"checkpoint_every": 2})


def test_a_private_run_without_dp_accounting_is_refused_saying_how_to_install_it(
        monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import fails
    accounting._epsilon.cache_clear()
    with pytest.raises(InvalidRun, match=r"pip install '\.\[privacy\]'"):
        _prepare(load_run_config(None, PRIVATE))
    _prepare(load_run_config(None, FEDERATED))  # a run without privacy needs none


def test_poisson_sampling_without_privacy_is_a_run_of_its_own():
    setup = _prepare(load_run_config(None, [*FEDERATED, "clients.sampling=poisson"]))
    assert PrivacyBudget.of(setup.algorithm) is None
    with pytest.raises(InvalidRun, match="Poisson sampling asks each client"):
        _prepare(load_run_config(None, [*FEDERATED, "clients.sampling=poisson",
                                        "clients.over_select=1.5"]))
