"""FedProx's Synthetic(alpha, beta): shapes and sizes as in the paper, the same data for
the same seed, and devices that differ more as alpha and beta grow."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.training.clients import ClientsError
from thrift_trainer.training.clients.synthetic import synthetic


def feature_mean_spread(devices: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """How far apart the devices' inputs lie: the spread over devices of each one's mean
    input value (B_k moves every feature of device k together)."""
    return float(np.std([x.mean() for x, _ in devices]))


def test_devices_have_the_papers_shapes_and_power_law_sizes() -> None:
    devices = synthetic(1.0, 1.0, seed=0)
    assert len(devices) == 30
    sizes = np.array([y.size for _, y in devices])
    for x, y in devices:
        assert x.shape == (y.size, 60) and x.dtype == np.float32 and y.dtype == np.int64
        assert y.min() >= 0 and y.max() < 10
    assert sizes.min() >= 50 and sizes.max() > 5 * np.median(sizes)  # a long tail


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data() -> None:
    first = synthetic(0.5, 0.5, seed=3, devices=5)
    again = synthetic(0.5, 0.5, seed=3, devices=5)
    other = synthetic(0.5, 0.5, seed=4, devices=5)
    for (x, y), (x2, y2) in zip(first, again, strict=True):
        assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(first[0][0][:50], other[0][0][:50])


def test_a_device_is_the_same_whatever_the_number_of_devices() -> None:
    few, many = synthetic(1.0, 1.0, seed=2, devices=3), synthetic(1.0, 1.0, seed=2, devices=8)
    for (x, y), (x2, y2) in zip(few, many[:3], strict=True):
        assert np.array_equal(x, x2) and np.array_equal(y, y2)


def test_synthetic_1_1_is_more_heterogeneous_than_synthetic_0_0() -> None:
    calm = synthetic(0.0, 0.0, seed=1, devices=30)
    wild = synthetic(1.0, 1.0, seed=1, devices=30)
    # at (0, 0) each device still has its own model and input centre (N(0, 1) draws),
    # so labels differ by device either way; beta is what spreads the inputs apart
    assert feature_mean_spread(wild) > 3 * feature_mean_spread(calm)
    assert feature_mean_spread(synthetic(0.0, 1.0, seed=1)) > 3 * feature_mean_spread(calm)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"alpha": -0.1, "beta": 0.0}, "alpha must be a finite number >= 0"),
    ({"alpha": 0.0, "beta": float("inf")}, "beta must be a finite number >= 0"),
    ({"alpha": 0.0, "beta": 0.0, "devices": 0}, "devices must be an integer >= 1"),
    ({"alpha": 0.0, "beta": 0.0, "classes": 1}, "classes must be an integer >= 2"),
])
def test_settings_out_of_range_raise_one_line(kwargs, words) -> None:
    with pytest.raises(ClientsError, match=words):
        synthetic(seed=0, **kwargs)
