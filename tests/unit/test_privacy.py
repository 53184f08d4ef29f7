"""Client-level differential privacy (training/privacy/): the clipping and noise of
DP-FedAvg, Poisson sampling, epsilon against dp-accounting's own, and the runs refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dp_accounting  # requirements-dev.txt installs it (the privacy extra)
import numpy as np
import pytest

from thrift_trainer.coordinator.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from thrift_trainer.coordinator.privacy_budget import PrivacyBudget
from thrift_trainer.coordinator.records import InvalidRun, RunRequest
from thrift_trainer.coordinator.request_checks import RequestLimits
from thrift_trainer.coordinator.run_setup import prepare
from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training import server_optim
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.privacy import accounting, mechanism
from thrift_trainer.training.privacy.accounting import Sampling
from thrift_trainer.training.privacy.settings import settings_from
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.schema import PrivacySettings
from thrift_trainer.training.units import UnitResult, UnitSpec

DATA = Path(__file__).resolve().parents[2] / "data"
FEDERATED = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
             "delta_avg.local_optimizer=sgd", "clients.count=10", "clients.per_round=3"]
PRIVATE = [*FEDERATED, "privacy.clip=1.0", "privacy.noise_multiplier=1.1"]
KEY, OTHER_KEY = bytes(range(32)), bytes(range(1, 33))  # noise keys of two runs


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
    mean = mechanism.private_mean(updates, like, 1.0, 0.0, 4.0, key=KEY, round_index=1)
    np.testing.assert_allclose(mean["w"], (np.array([0.6, 0.8]) + [0.1, 0.2]) / 4.0,
                               rtol=1e-6)
    assert mean["w"].dtype == np.float32  # the model's dtype


# --------------------------------------------------------------------- noise
def test_the_noise_has_standard_deviation_z_times_clip_and_is_keyed_by_round():
    like = {"big": np.zeros((400, 500), dtype=np.float64), "small": np.zeros(7)}
    clip, z = 0.7, 1.3
    noised = mechanism.private_mean([], like, clip, z, 1.0, key=KEY, round_index=3)
    values = np.concatenate([v.ravel() for v in noised.values()])
    # 200,007 draws: the sample std is within 1% of sigma with overwhelming probability
    # (its relative standard error is about 1 / sqrt(2n) = 0.16%)
    assert np.std(values) == pytest.approx(z * clip, rel=0.01)
    assert abs(np.mean(values)) < 5 * z * clip / np.sqrt(values.size)
    again = mechanism.private_mean([], like, clip, z, 1.0, key=KEY, round_index=3)
    other = mechanism.private_mean([], like, clip, z, 1.0, key=KEY, round_index=4)
    np.testing.assert_array_equal(noised["big"], again["big"])
    assert not np.array_equal(noised["big"], other["big"])


def test_the_noise_is_divided_by_the_expected_number_of_clients():
    like = {"w": np.zeros(100_000)}
    one = mechanism.private_mean([], like, 2.0, 1.0, 1.0, key=KEY, round_index=1)["w"]
    ten = mechanism.private_mean([], like, 2.0, 1.0, 10.0, key=KEY, round_index=1)["w"]
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
    if sampling.kind == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(
            sampling.per_round / sampling.count,
            dp_accounting.GaussianDpEvent(settings.noise_multiplier))
    else:  # replace-one: the sum's sensitivity is twice the clip, the multiplier half z
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            sampling.count, sampling.per_round,
            dp_accounting.GaussianDpEvent(settings.noise_multiplier / 2))
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
    config = load_run_config(None, [*PRIVATE, "privacy.target_epsilon=16.0"])
    budget = PrivacyBudget.of(_prepare(config, rounds=3).algorithm)
    fit = accounting.rounds_within(budget.settings, budget.sampling, 20)
    # 3 of 10 clients at z 1.1 under replace-one: epsilon 15.3 after 3 rounds, 17.2 after 4
    assert fit == 3
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
    ([*PRIVATE, "clients.eval_every=1", "clients.validation_fraction=0.2"],
     "privacy: clients.eval_every sends each round.s"),
    ([*PRIVATE, "schedule.mode=async"], "privacy: async mode makes a version of every"),
    ([*PRIVATE, "schedule.mode=buffered"], "buffered mode needs schedule.updates_per_round 1"),
    ([*PRIVATE, "schedule.mode=buffered", "schedule.updates_per_round=2"],
     "buffered mode needs schedule.updates_per_round 1"),
    ([*PRIVATE, "schedule.mode=buffered", "schedule.updates_per_round=1",
      "privacy.accountant=pld"], "a buffered run is accounted by rdp"),
    ([*PRIVATE, "schedule.mode=buffered", "schedule.updates_per_round=1",
      "schedule.buffer_size=11"], "schedule.buffer_size 11 needs as many clients"),
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


# ------------------------------------------------------------- buffered mode
BUFFERED = [*PRIVATE, "schedule.mode=buffered", "schedule.buffer_size=3",
            "schedule.updates_per_round=1"]


def test_a_buffered_release_is_accounted_as_a_gaussian_without_sampling():
    """Each buffer is one Gaussian mechanism of z / 2 under replace-one (no amplification:
    its clients are whoever finished first), composed over the releases."""
    budget = PrivacyBudget.of(_prepare(load_run_config(None, BUFFERED)).algorithm)
    assert budget.sampling.kind == "buffered" and budget.sampling.expected == 3
    spent = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for releases in range(1, 6):
        spent.compose(dp_accounting.GaussianDpEvent(1.1 / 2))
        mine = budget.spent(releases)
        assert float(f"{mine:.3g}") == float(f"{spent.get_epsilon(1e-5):.3g}"), releases
    # weaker than the sync rounds' sampled accounting of the same run
    synced = PrivacyBudget.of(_prepare(load_run_config(None, PRIVATE)).algorithm)
    assert budget.spent(3) > synced.spent(3)


def _updates(weights, scale: float) -> dict:
    return {name: np.full(np.shape(value), scale) for name, value in weights.items()}


def test_a_buffered_release_counts_a_client_once_over_the_buffer_size():
    algorithm = _prepare(load_run_config(None, BUFFERED)).algorithm
    weights = algorithm.initial_weights()

    def result(client: str, scale: float) -> UnitResult:
        return UnitResult(UnitSpec(f"{client}.d", "", client=client),
                          _updates(weights, scale), 10, 0.5, "n0")

    once = algorithm.aggregate(2, weights, [result("a", 0.1), result("b", -0.2)], [])
    twice = algorithm.aggregate(2, weights, [result("a", 0.1), result("b", -0.2),
                                             result("a", 0.3)], [])
    for name in weights:
        np.testing.assert_array_equal(once[name], twice[name], err_msg=name)
    # the sum of the clipped updates plus the release's noise, over the buffer size
    mean = mechanism.private_mean([_updates(weights, 0.1), _updates(weights, -0.2)],
                                  weights, 1.0, 1.1, 3.0, algorithm.noise_key, 2)
    assert any(np.any(once[name] != weights[name]) for name in weights)
    expected = algorithm.apply(weights, mean)
    for name in weights:
        np.testing.assert_allclose(once[name], expected[name], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("server", ["momentum", "adam", "nesterov"])
def test_a_private_rounds_noised_mean_goes_through_the_server_optimizer(server):
    """FedAvgM, FedAdam and the Nesterov outer step take the noised mean as they take the
    plain one (post-processing), their state carried from round to round."""
    algorithm = _prepare(load_run_config(None, [
        *PRIVATE, f"delta_avg.server_optimizer={server}", "delta_avg.server_lr=0.5"])).algorithm
    weights = algorithm.initial_weights()
    reference = server_optim.make_server_optimizer(server, **(
        {"lr": 0.5} if server == "adam" else {"lr": 0.5, "beta": algorithm.config[
            "server_momentum"]}))
    expected = weights
    for round_index, scale in ((1, 0.3), (2, -0.1)):
        results = [UnitResult(UnitSpec(f"{c}.r{round_index}", "", client=c),
                              _updates(weights, scale * (i + 1)), 10, 0.5, "n0")
                   for i, c in enumerate(("a", "b"))]
        weights = algorithm.aggregate(round_index, weights, results, [])
        mean = mechanism.private_mean([r.update for r in results], expected, 1.0, 1.1, 3.0,
                                      algorithm.noise_key, round_index)
        expected = reference.step(expected, mean)
        for name in weights:
            np.testing.assert_allclose(weights[name], expected[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{server} round {round_index} {name}")


# ------------------------------------------------------- node-resident clients
RESIDENT = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
            "delta_avg.local_optimizer=sgd", "clients.placement=nodes", "clients.per_round=2",
            "clients.sampling=poisson", "privacy.clip=1.0", "privacy.noise_multiplier=1.1"]


def test_a_private_run_keeps_the_clients_first_announced_as_its_roster():
    """Clients announced later are never drawn, and clients no longer announced stay in
    the draw: q stays 2 / 4, from the roster the epsilon was computed with."""
    algorithm = _prepare(load_run_config(None, RESIDENT)).algorithm
    assert algorithm.privacy_sampling() is None  # not known before the nodes announce
    first = {"a": 10, "b": 5, "c": 7, "d": 3}
    algorithm.take_clients(first, {})
    assert algorithm.privacy_sampling() == Sampling("poisson", 4, 2)
    algorithm.take_clients({"a": 10, "e": 8, "f": 9}, {})  # d left, e and f are new
    assert algorithm.privacy_sampling() == Sampling("poisson", 4, 2)
    drawn = {c for r in range(1, 60) for c in (u.client for u in algorithm.plan_round(r))}
    assert drawn == set(first)
    without = _prepare(load_run_config(None, RESIDENT[:-2])).algorithm  # not private
    without.take_clients(first, {})
    without.take_clients({"a": 10, "e": 8}, {})
    assert {u.client for u in without.client_units()} == {"a", "e"}


def test_the_roster_and_clip_in_force_survive_a_checkpoint(tmp_path):
    config = load_run_config(None, [*RESIDENT, "privacy.adaptive_clip_quantile=0.5"])
    algorithm = _prepare(config).algorithm
    algorithm.take_clients({"a": 10, "b": 5, "c": 7}, {"a": {1: 4, 2: 6}})
    algorithm._release.clip = 0.37  # as a few rounds of adaptive clipping may leave it
    weights = algorithm.initial_weights()
    save_checkpoint(tmp_path, Checkpoint(3, weights, algorithm.state_dict(), None), {})
    state = load_checkpoint(tmp_path).optimizer
    resumed = _prepare(config).algorithm
    resumed.load_state_dict(state)
    assert resumed._release.clip == 0.37
    assert resumed.noise_key == algorithm.noise_key  # the resumed rounds draw as before
    assert resumed.privacy_sampling() == Sampling("poisson", 3, 2)
    assert resumed.partition == algorithm.partition  # label counts too
    resumed.take_clients({"a": 10, "z": 4}, {})  # the nodes' announcement after the resume
    assert [u.client for u in resumed.client_units()] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="privacy.clip"):
        _prepare(config).algorithm.load_state_dict(
            {k: v for k, v in state.items() if k != "privacy.clip"})
    with pytest.raises(ValueError, match="privacy.noise_key"):
        _prepare(config).algorithm.load_state_dict(
            {k: v for k, v in state.items() if k != "privacy.noise_key"})


def test_a_node_resident_run_past_its_target_fails_once_its_clients_are_known():
    config = load_run_config(None, [*RESIDENT, "privacy.target_epsilon=3.0"])
    setup = _prepare(config, rounds=50)  # accepted: q is not known yet
    setup.algorithm.take_clients({"a": 10, "b": 5, "c": 7, "d": 3}, {})
    with pytest.raises(RoundFailed, match="50 rounds would spend epsilon .* rounds fit"):
        PrivacyBudget.of(setup.algorithm).check_plan(50, ["n1"])
    with pytest.raises(InvalidRun, match="pld accounts Poisson sampling only"):
        _prepare(load_run_config(None, [*RESIDENT, "clients.sampling=fixed",
                                        "privacy.accountant=pld"]))


# ---------------------------------------------------------- adaptive clipping
ADAPTIVE = PrivacySettings(clip=1.0, noise_multiplier=1.1, adaptive_clip_quantile=0.5,
                           clip_count_stddev=2.0)


def test_the_updates_noise_multiplier_is_z_delta_and_undefined_settings_are_refused():
    from thrift_trainer.training.privacy import adaptive

    z_delta = adaptive.update_noise_multiplier(ADAPTIVE, 10.0)
    assert z_delta == pytest.approx((1.1 ** -2 - 4.0 ** -2) ** -0.5, rel=1e-12)
    assert z_delta > 1.1  # the count's release is paid for with more noise on the updates
    fixed = PrivacySettings(clip=1.0, noise_multiplier=1.1)
    assert adaptive.update_noise_multiplier(fixed, 10.0) == 1.1
    paper = PrivacySettings(clip=1.0, noise_multiplier=1.1, adaptive_clip_quantile=0.5)
    assert adaptive.count_stddev(paper, 100.0) == 5.0  # expected clients / 20
    with pytest.raises(ConfigError, match="2 sigma_b > z"):  # 2 x 10 / 20 <= 1.1
        adaptive.update_noise_multiplier(paper, 10.0)
    # accounted with z: the two releases together are one Gaussian mechanism of z
    assert accounting.epsilon(ADAPTIVE, Sampling("poisson", 100, 10), 5) == \
        accounting.epsilon(fixed, Sampling("poisson", 100, 10), 5)


def test_the_clip_steps_geometrically_toward_the_target_quantile():
    from thrift_trainer.training.privacy import adaptive

    assert adaptive.next_clip(2.0, 0.9, ADAPTIVE) == pytest.approx(2.0 * np.exp(-0.2 * 0.4))
    assert adaptive.next_clip(2.0, 0.1, ADAPTIVE) == pytest.approx(2.0 * np.exp(0.2 * 0.4))
    assert adaptive.next_clip(2.0, 0.5, ADAPTIVE) == 2.0
    # the noised count: b_i - 1/2 summed, noise of sigma_b, over the expected clients
    norms = [0.2, 0.9, 1.0, 3.0]
    quiet = adaptive.fraction_under(norms, 1.0, 1e-12, 4.0, key=KEY, round_index=1)
    assert quiet == pytest.approx(3 / 4)
    noisy = [adaptive.fraction_under(norms, 1.0, 2.0, 4.0, key=KEY, round_index=r)
             for r in range(1, 2001)]
    assert np.mean(noisy) == pytest.approx(0.75, abs=5 * 0.5 / np.sqrt(2000))
    assert np.std(noisy) == pytest.approx(2.0 / 4.0, rel=0.1)
    assert noisy[0] == adaptive.fraction_under(norms, 1.0, 2.0, 4.0, key=KEY, round_index=1)


def test_rounds_of_adaptive_clipping_settle_at_the_quantile_of_the_norms():
    """Norms lognormal around 1 (median 1, 90th percentile 1.9): from a clip of 10 and
    of 0.01, the clip ends near the quantile asked for."""
    from thrift_trainer.training.privacy.release import PrivateRelease

    like = {"w": np.zeros(1)}
    norm_draws = np.random.default_rng(7).lognormal(0.0, 0.5, size=(300, 50))
    for quantile, expected in ((0.5, 1.0), (0.9, np.exp(0.5 * 1.2816))):
        for start in (10.0, 0.01):
            release = PrivateRelease(PrivacySettings(
                clip=start, noise_multiplier=1.0, adaptive_clip_quantile=quantile,
                clip_count_stddev=2.5))
            release.use_key(KEY)
            for r, norms in enumerate(norm_draws, start=1):
                release.mean([{"w": np.array([n])} for n in norms], like, 50.0, r)
            assert release.clip == pytest.approx(expected, rel=0.15), (quantile, start)
            assert release.last_clip != start


def test_an_adaptive_round_adds_noise_of_z_delta_times_the_clip_in_force():
    from thrift_trainer.training.privacy import adaptive
    from thrift_trainer.training.privacy.release import PrivateRelease

    release = PrivateRelease(ADAPTIVE)
    release.use_key(KEY)
    release.clip = 0.8
    mean = release.mean([], {"w": np.zeros(200_000)}, 10.0, round_index=2)["w"]
    z_delta = adaptive.update_noise_multiplier(ADAPTIVE, 10.0)
    assert np.std(mean) == pytest.approx(z_delta * 0.8 / 10.0, rel=0.01)
    assert release.last_clip == 0.8
    # no client: the centred count is its noise alone, an estimate of 1/2 give or take it
    fraction = adaptive.fraction_under([], 0.8, 2.0, 10.0, key=KEY, round_index=2)
    assert release.clip == adaptive.next_clip(0.8, fraction, ADAPTIVE) != 0.8


@pytest.mark.parametrize("raw, why", [
    ({"clip": 1.0, "adaptive_clip_quantile": 1.0}, "adaptive_clip_quantile must be in"),
    ({"clip": 1.0, "adaptive_clip_quantile": 0.5, "clip_learning_rate": 0.0},
     "clip_learning_rate must be above 0"),
    ({"clip": 1.0, "clip_count_stddev": -1.0}, "clip_count_stddev must be a finite"),
])
def test_bad_adaptive_settings_are_refused_naming_the_key(raw, why):
    with pytest.raises(ConfigError, match=why):
        settings_from(raw)


def test_an_adaptive_run_whose_count_noise_leaves_no_z_delta_is_refused_before_round_1():
    with pytest.raises(InvalidRun, match="2 sigma_b > z"):  # 3 clients a round: 0.15
        _prepare(load_run_config(None, [*PRIVATE, "privacy.adaptive_clip_quantile=0.5"]))
    _prepare(load_run_config(None, [*PRIVATE, "privacy.adaptive_clip_quantile=0.5",
                                    "privacy.clip_count_stddev=1.0"]))
