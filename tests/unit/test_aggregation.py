"""Aggregation rules against plain numpy references, their settings, and the hook."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from thrift_trainer.client import cli
from thrift_trainer.training import aggregation
from thrift_trainer.training.aggregation import aggregate, check_settings
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitResult

REPO = Path(__file__).resolve().parents[2]
LETTERS = REPO / "data" / "letters"  # 11 train_* files: 11 updates a round


def updates(n: int, seed: int = 0) -> tuple[list[dict], list[int]]:
    rng = np.random.default_rng(seed)
    items = [{"W": rng.normal(size=(3, 4)), "b": rng.normal(size=5).astype(np.float32)}
             for _ in range(n)]
    return items, [int(rng.integers(1, 50)) for _ in range(n)]


def settings(**changes) -> dict:
    return check_settings(changes)


# ------------------------------------------------------------ plain references
def ref_mean(items, samples, name):
    pairs = zip(items, samples, strict=True)
    return sum(u[name].astype(np.float64) * n for u, n in pairs) / sum(samples)


def ref_median(items, name):
    stacked = np.array([u[name] for u in items], dtype=np.float64)
    out = np.empty(stacked.shape[1:])
    for index in np.ndindex(out.shape):
        column = sorted(stacked[(slice(None), *index)])
        mid = len(column) // 2
        out[index] = column[mid] if len(column) % 2 else (column[mid - 1] + column[mid]) / 2
    return out


def ref_trimmed(items, samples, name, fraction):
    cut = int(fraction * len(items))
    out = np.empty(items[0][name].shape)
    for index in np.ndindex(out.shape):
        pairs = sorted((float(u[name][index]), n) for u, n in zip(items, samples, strict=True))
        kept = pairs[cut:len(pairs) - cut]
        out[index] = sum(v * n for v, n in kept) / sum(n for _, n in kept)
    return out


def ref_krum(items, samples, name, f, keep):
    flat = [np.concatenate([u[k].astype(np.float64).ravel() for k in items[0]]) for u in items]
    n = len(items)
    scores = []
    for i in range(n):
        dists = sorted(float(np.sum((flat[i] - flat[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dists[:n - f - 2]))
    chosen = sorted(range(n), key=lambda i: scores[i])[:keep]
    return ref_mean([items[i] for i in chosen], [samples[i] for i in chosen], name)


# ----------------------------------------------------------------------- maths
@pytest.mark.parametrize("n", [1, 4, 7])
def test_mean_and_median_match_the_references(n):
    items, samples = updates(n, seed=n)
    mean = aggregate(settings(), items, samples)
    median = aggregate(settings(rule="median"), items, samples)
    for name in ("W", "b"):
        np.testing.assert_allclose(mean[name], ref_mean(items, samples, name), rtol=1e-12)
        np.testing.assert_allclose(median[name], ref_median(items, name), rtol=1e-12)


@pytest.mark.parametrize("n, fraction, equal", [(5, 0.2, False), (10, 0.2, False),
                                                (10, 0.35, False), (3, 0.0, False),
                                                (11, 0.2, True), (4, 0.3, True)])
def test_trimmed_mean_matches_the_reference(n, fraction, equal):
    items, samples = updates(n, seed=10 + n)
    samples = [7] * n if equal else samples
    got = aggregate(settings(rule="trimmed_mean", trim_fraction=fraction), items, samples)
    for name in ("W", "b"):
        np.testing.assert_allclose(got[name], ref_trimmed(items, samples, name, fraction),
                                   rtol=1e-12)


@pytest.mark.parametrize("n, f, keep", [(7, 1, 1), (9, 2, 3), (11, 3, 3)])
def test_multi_krum_matches_the_reference(n, f, keep):
    items, samples = updates(n, seed=20 + n)
    got = aggregate(settings(rule="krum", byzantine=f, krum_keep=keep), items, samples)
    for name in ("W", "b"):
        np.testing.assert_allclose(got[name], ref_krum(items, samples, name, f, keep),
                                   rtol=1e-10)


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum"])
def test_robust_rules_ignore_a_few_sign_flipped_updates(rule):
    rng = np.random.default_rng(5)
    honest = [{"W": 1.0 + 0.1 * rng.normal(size=20)} for _ in range(8)]
    flipped = [{"W": -10 * u["W"]} for u in honest[:2]]
    items, samples = honest + flipped, [10] * 10
    assert np.mean(aggregate(settings(), items, samples)["W"]) < 0  # the mean is dragged over
    got = aggregate(settings(rule=rule, byzantine=2, krum_keep=4), items, samples)["W"]
    assert np.all(np.abs(got - 1.0) < 0.5)


# ------------------------------------------------------------------ the hook
def results_of(items, samples, units) -> list[UnitResult]:
    return [UnitResult(u, item, n) for u, item, n in zip(units, items, samples, strict=True)]


def test_mean_stays_the_float64_fold_of_the_weighted_average_bit_for_bit():
    algorithm = DeltaAveraging("mlp", {}, LETTERS)
    units = algorithm.plan_round(1)
    items, samples = updates(len(units), seed=4)
    combined = algorithm.combine(results_of(items, samples, units))
    for name in ("W", "b"):
        folded = np.asarray(items[0][name], np.float64) * samples[0]
        for item, n in zip(items[1:], samples[1:], strict=True):
            folded += np.asarray(item[name], np.float64) * n
        assert np.array_equal(combined[name], folded / sum(samples))


def test_a_narrow_mean_is_the_float64_mean_cast_to_float32_bit_for_bit(monkeypatch):
    monkeypatch.setattr(aggregation, "BLOCK_ELEMENTS", 7)  # blocks that cut rows
    rng = np.random.default_rng(3)
    items = [{"w": rng.normal(size=(5, 9)).astype(np.float32), "d": rng.normal(size=4),
              "n": np.array(3 + i, dtype=np.int64)} for i in range(3)]
    samples = [3, 11, 5]
    wide = aggregation.weighted_mean(items, samples)
    narrow = aggregation.weighted_mean(items, samples, narrow=True)
    assert narrow["w"].dtype == np.float32 and wide["w"].dtype == np.float64
    assert np.array_equal(narrow["w"], wide["w"].astype(np.float32))
    for name in ("d", "n"):  # not all float32: float64 as before
        assert narrow[name].dtype == np.float64 and np.array_equal(narrow[name], wide[name])
    block = slice(7, 14)
    parts = aggregation.flat_parts(items, "w")
    assert np.array_equal(aggregation.mean_of_block(parts, samples, block),
                          wide["w"].reshape(-1)[block])


def test_only_algorithms_that_step_in_float32_get_a_narrow_mean():
    items, samples = updates(2, seed=1)
    narrow = aggregate(settings(), items, samples, narrow=True)
    assert narrow["b"].dtype == np.float32 and narrow["W"].dtype == np.float64
    assert aggregate(settings(), items, samples)["b"].dtype == np.float64
    assert aggregate(settings(rule="median"), items, samples, narrow=True)["b"].dtype \
        == np.float64  # a robust rule returns what it returns
    assert SyncSGD("mlp", {}, LETTERS).applies_float32
    assert not DeltaAveraging("mlp", {}, LETTERS).applies_float32


@pytest.mark.parametrize("cls", [DeltaAveraging, SyncSGD])
def test_the_rule_in_the_config_combines_the_round(cls):
    algorithm = cls("mlp", {"aggregation": {"rule": "median"}}, LETTERS)
    units = algorithm.plan_round(1)
    items, samples = updates(len(units), seed=2)
    combined = algorithm.combine(results_of(items, samples, units))
    expected = aggregate(settings(rule="median"), items, samples)
    assert all(np.array_equal(combined[k], expected[k]) for k in ("W", "b"))


# ----------------------------------------------------------------- settings
def test_settings_defaults():
    assert check_settings(None) == defaults(AggregationSettings)
    assert check_settings({"trim_fraction": 0})["trim_fraction"] == 0.0


@pytest.mark.parametrize("given, key", [
    ({"rule": "avg"}, "aggregation.rule"),
    ({"trim_fraction": 0.5}, "aggregation.trim_fraction"),
    ({"trim_fraction": -0.1}, "aggregation.trim_fraction"),
    ({"byzantine": -1}, "aggregation.byzantine"),
    ({"krum_keep": 0}, "aggregation.krum_keep"),
    ({"rule": 3}, "aggregation.rule"),
    ({"krum_kep": 1}, "aggregation.krum_kep"),
    ({"trim_fraction": float("nan")}, "aggregation.trim_fraction"),
])
def test_bad_settings_are_refused_naming_the_key(given, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        DeltaAveraging.check_config("mlp", {"aggregation": given})


def test_krum_keep_beyond_n_minus_2f_minus_2_is_refused_before_the_run():
    ok = {"rule": "krum", "byzantine": 2, "krum_keep": 5}  # 11 - 4 - 2 = 5
    DeltaAveraging("mlp", {"aggregation": ok}, LETTERS)
    with pytest.raises(ConfigError, match="'aggregation.krum_keep'.*at most n - 2f - 2 = 5"):
        DeltaAveraging("mlp", {"aggregation": {**ok, "krum_keep": 6}}, LETTERS)
    with pytest.raises(ConfigError, match="'aggregation.krum_keep'"):  # K = 3 results a round
        SyncSGD("mlp", {"aggregation": {"rule": "krum"}}, LETTERS)


def test_fl_gan_takes_robust_rules_and_md_gan_refuses_them():
    assert FLGan.check_config("dcgan28", {"aggregation": {"rule": "median"}})[
        "aggregation"]["rule"] == "median"
    MDGan.check_config("dcgan28", {"aggregation": {"rule": "mean"}})
    with pytest.raises(ConfigError, match="'aggregation.rule' must be 'mean' for md_gan"):
        MDGan.check_config("dcgan28", {"aggregation": {"rule": "trimmed_mean"}})


def test_the_client_sends_the_aggregation_section_inside_the_config():
    recipe = str(REPO / "configs" / "letters_recommended.yaml")
    args = cli.parse_train_args(["localhost", "9095", "--config", recipe, "--set",
                                 "aggregation.rule=median", "--quiet"])
    config = json.loads(cli.train_request(args, "r1").config_json)
    assert config["aggregation"] == {**defaults(AggregationSettings), "rule": "median"}
    assert DeltaAveraging.check_config("mlp", config)["aggregation"]["rule"] == "median"
    assert load_run_config(None, []).section("aggregation") == defaults(AggregationSettings)


@pytest.mark.parametrize("narrow", [False, True])
def test_the_mean_of_one_update_is_the_folds_bits_taken_in_one_pass(narrow):
    rng = np.random.default_rng(5)
    wide = (rng.normal(size=4000) * 10.0 ** rng.integers(-40, 30, 4000)).astype(np.float32)
    wide[:4] = [-0.0, 0.0, np.float32(1e-45), -np.float32(3e-38)]  # signed zeros, subnormals
    item = {"w": wide.reshape(40, 100), "h": rng.normal(size=50).astype(np.float16),
            "d": rng.normal(size=6), "n": np.array(7, dtype=np.int64)}
    for samples in (1, 64, 320, 12_345, 2**29 - 1):
        alone = aggregation.weighted_mean([item], [samples], narrow)
        for name, value in item.items():
            flat = aggregation.flat_parts([item], name)
            folded = aggregation.mean_of_block(flat, [samples], slice(0, value.size))
            assert alone[name].shape == value.shape
            assert alone[name].dtype == (np.float32 if narrow and name == "w" else np.float64)
            assert alone[name].tobytes() == folded.astype(alone[name].dtype).tobytes(), name
    assert np.signbit(aggregation.weighted_mean([item], [64])["w"].reshape(-1)[0]) == \
        np.signbit(aggregation.mean_of_block([wide], [64], slice(0, 1))[0])  # +0.0 both
