"""A round's results kept by the round state and combined by the weighted mean."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from thrift_trainer.engine.round_state import RoundState
from thrift_trainer.engine.tasks import TaskResult, TaskStatus
from thrift_trainer.training.algorithms.base import combine
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitResult, UnitSpec


def updates(n: int, seed: int = 0) -> list[tuple[dict, int]]:
    rng = np.random.default_rng(seed)
    return [({"W": rng.normal(size=(3, 4)), "V": rng.normal(size=5)}, int(rng.integers(1, 50)))
            for _ in range(n)]


def results_of(items: list[tuple[dict, int]]) -> list[UnitResult]:
    return [UnitResult(UnitSpec(f"u{i}", "f"), update, n) for i, (update, n) in enumerate(items)]


def answer(n: int) -> TaskResult:
    return TaskResult(status=TaskStatus.COMPLETED, update={}, num_samples=n, model_version=1,
                      loss=0.5)


def test_mean_is_weighted_by_samples():
    items = updates(6)
    total = sum(n for _, n in items)
    expected = sum(u["W"] * n for u, n in items) / total
    np.testing.assert_allclose(combine(defaults(AggregationSettings), results_of(items))["W"],
                               expected, rtol=1e-12)


def test_mean_is_the_float64_fold_in_unit_order_bit_for_bit():
    """What deterministic runs have always computed: sum of update * samples, unit by
    unit in float64, divided by the total."""
    items = updates(11, seed=3)
    folded = {}
    for update, n in items:
        for name, value in update.items():
            scaled = np.asarray(value, dtype=np.float64) * n
            folded[name] = folded[name] + scaled if name in folded else scaled
    total = sum(n for _, n in items)
    combined = combine(defaults(AggregationSettings), results_of(items))
    for name in ("W", "V"):
        assert np.array_equal(combined[name], folded[name] / total)


def test_arrival_order_changes_no_bit():
    items = updates(11, seed=3)
    specs = [UnitSpec(f"u{i}", "f") for i in range(len(items))]
    outcomes = []
    for order in (range(len(items)), reversed(range(len(items)))):
        state = RoundState(1, specs, len(specs), max_attempts=2)
        for i in order:
            assert state.complete(state.units[i], items[i][0], answer(items[i][1]), "n")
        outcomes.append(state.outcome())
    assert [r.unit.unit_id for r in outcomes[1].results] == [s.unit_id for s in specs]
    forward, backward = (combine(defaults(AggregationSettings), o.results) for o in outcomes)
    for name in ("W", "V"):
        assert np.array_equal(forward[name], backward[name])
    assert outcomes[0].train_loss == outcomes[1].train_loss == 0.5


def test_concurrent_results_lose_nothing_and_a_unit_counts_once():
    specs = [UnitSpec(f"u{i}", "f") for i in range(800)]
    state = RoundState(1, specs, len(specs), max_attempts=2)
    ones = {"W": np.ones(4)}
    kept = []

    def complete_many(offset: int) -> None:
        for i in range(200):
            kept.append(state.complete(state.units[offset + i], ones, answer(1), "n"))
            kept.append(state.complete(state.units[offset + i], ones, answer(1), "m"))

    threads = [threading.Thread(target=complete_many, args=(k * 200,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcome = state.outcome()
    assert outcome.completed == 800 and kept.count(True) == 800
    assert set(outcome.placement.values()) == {"n"}
    np.testing.assert_array_equal(combine(defaults(AggregationSettings), outcome.results)["W"],
                                  np.ones(4))


def test_nothing_to_combine_is_an_error():
    with pytest.raises(ValueError, match="no result"):
        combine(defaults(AggregationSettings), [])
