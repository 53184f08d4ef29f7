"""The running weighted average the coordinator folds results into."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from training.algorithms.base import WeightedAverage


def updates(n: int, seed: int = 0) -> list[tuple[dict, int]]:
    rng = np.random.default_rng(seed)
    return [({"W": rng.normal(size=(3, 4)), "V": rng.normal(size=5)}, int(rng.integers(1, 50)))
            for _ in range(n)]


def test_average_is_weighted_by_samples():
    items = updates(6)
    avg = WeightedAverage()
    for i, (update, n) in enumerate(items):
        avg.add(i, update, n)
    total = sum(n for _, n in items)
    expected = sum(u["W"] * n for u, n in items) / total
    np.testing.assert_allclose(avg.result()["W"], expected, rtol=1e-12)
    assert avg.count == 6


def test_deterministic_mode_ignores_arrival_order_bit_for_bit():
    items = updates(11, seed=3)
    forward, backward = WeightedAverage(True), WeightedAverage(True)
    for i, (update, n) in enumerate(items):
        forward.add(i, update, n)
    for i, (update, n) in reversed(list(enumerate(items))):
        backward.add(i, update, n)
    for name in ("W", "V"):
        assert np.array_equal(forward.result()[name], backward.result()[name])


def test_concurrent_adds_lose_nothing():
    avg = WeightedAverage()
    ones = {"W": np.ones(4)}

    def add_many(offset: int) -> None:
        for i in range(200):
            avg.add(offset + i, ones, 1)

    threads = [threading.Thread(target=add_many, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert avg.count == 800
    np.testing.assert_array_equal(avg.result()["W"], np.ones(4))


def test_empty_average_and_bad_counts_are_errors():
    with pytest.raises(ValueError, match="no update"):
        WeightedAverage().result()
    with pytest.raises(ValueError, match="positive sample count"):
        WeightedAverage().add(0, {"W": np.ones(2)}, 0)
