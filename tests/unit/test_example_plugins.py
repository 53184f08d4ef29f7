"""The plug-ins of examples/plugins: FedProx, the geometric median and SignSGD, each
against its definition, and SignSGD's decoder against malformed parts from the network."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from devtools.local_cluster import REPO
from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training.algorithms import ConfigError
from thrift_trainer.training.compression import CompressionSettings, compress_update, decompress
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.plugins import allow, reset
from thrift_trainer.training.units import UnitJob

EXAMPLES = REPO / "examples" / "plugins"


@pytest.fixture(scope="module", autouse=True)
def example_plugins():
    """The examples allowed as ``--plugins fedprox,geomedian,signsgd --plugin-dir
    examples/plugins`` would allow them."""
    path_before = list(sys.path)
    reset()
    allow(["fedprox", "geomedian", "signsgd"], EXAMPLES)
    yield
    reset()
    sys.path[:] = path_before


# ------------------------------------------------------------------------- FedProx
FEDPROX = {"mu": 0.5, "units": 10, "local_steps": 20, "local_optimizer": "sgd",
           "eta": 0.05, "batch_size": 32,
           "model": {"args": {"hidden": [16]}}, "data": {"format": "letters"}}


def fedprox_delta_norm(mu: float) -> float:
    """The norm of the change one unit of local training makes, under this mu."""
    from fedprox import FedProx

    algorithm = FedProx("mlp_classifier", {**FEDPROX, "mu": mu},
                        DEFAULT_DATA_ROOT / "letters", "letters")
    weights = algorithm.initial_weights()
    unit = algorithm.plan_round(1)[0]
    job = UnitJob("run", 1, unit, "mlp_classifier", algorithm.config, weights,
                  dataset="letters")
    update = FedProx.run_unit(job, DEFAULT_DATA_ROOT / "letters").update
    return float(np.sqrt(sum(np.sum(value ** 2) for value in update.values())))


def test_fedprox_keeps_local_training_near_the_rounds_weights() -> None:
    free, held = fedprox_delta_norm(0.0), fedprox_delta_norm(5.0)
    assert held < 0.8 * free


def test_fedprox_penalty_is_half_mu_times_the_squared_distance() -> None:
    import torch
    from fedprox import FedProx

    module = torch.nn.Linear(2, 1)
    weights = {name: value.detach().numpy().copy() for name, value in
               module.state_dict().items()}
    with torch.no_grad():
        module.weight += 1.0  # two entries moved by 1: squared distance 2
    job = UnitJob("run", 1, None, "mlp_classifier",
                  FedProx.check_config("mlp_classifier", {"mu": 0.3}), weights)
    penalty = FedProx.local_penalty(job)
    assert penalty(module, weights=weights).item() == pytest.approx(0.5 * 0.3 * 2)
    no_penalty = UnitJob("run", 1, None, "mlp_classifier",
                         FedProx.check_config("mlp_classifier", {"mu": 0}), weights)
    assert FedProx.local_penalty(no_penalty) is None


def test_fedprox_takes_the_read_only_weights_a_node_receives_without_a_warning() -> None:
    import warnings

    import torch
    from fedprox import FedProx

    module = torch.nn.Linear(2, 1)
    weights = {name: value.detach().numpy().copy() for name, value in
               module.state_dict().items()}
    for value in weights.values():
        value.flags.writeable = False  # as decoded from the wire
    job = UnitJob("run", 1, None, "mlp_classifier",
                  FedProx.check_config("mlp_classifier", {"mu": 0.3}), weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "The given NumPy array is not writable" before
        assert FedProx.local_penalty(job)(module, weights=weights).item() == 0.0


def test_fedprox_checks_mu_and_leaves_the_rest_to_delta_averaging() -> None:
    from fedprox import FedProx

    config = FedProx.check_config("mlp_classifier", {"mu": 1, "eta": 0.1})
    assert config["mu"] == 1.0 and config["eta"] == 0.1 and config["units"] == 10
    for bad in (-1, float("nan"), True, "0.1"):
        with pytest.raises(ConfigError, match="'mu' must be a number >= 0"):
            FedProx.check_config("mlp_classifier", {"mu": bad})
    with pytest.raises(ConfigError, match="unknown config key 'nu'"):
        FedProx.check_config("mlp_classifier", {"nu": 0.1})


# --------------------------------------------------------------- geometric median
def summed_distance(point: np.ndarray, points: np.ndarray, weights: np.ndarray) -> float:
    return float(weights @ np.linalg.norm(points - point, axis=1))


def test_the_geometric_median_minimises_the_summed_distance() -> None:
    from geomedian import geometric_median

    rng = np.random.default_rng(0)
    points = rng.normal(size=(7, 3))
    samples = [1, 2, 3, 1, 2, 3, 4]
    updates = [{"a": p[:2].reshape(1, 2), "b": p[2:]} for p in points]
    found = geometric_median(updates, samples)
    assert found["a"].shape == (1, 2) and found["b"].shape == (1,)
    median = np.concatenate([found["a"].ravel(), found["b"]])
    weights = np.asarray(samples, dtype=float)
    best = summed_distance(median, points, weights)
    assert best < summed_distance(weights @ points / weights.sum(), points, weights)
    for step in rng.normal(scale=1e-2, size=(50, 3)):  # no nearby point does better
        assert best <= summed_distance(median + step, points, weights) + 1e-6


def test_the_geometric_median_ignores_a_far_outlier_that_drags_the_mean() -> None:
    from geomedian import geometric_median

    honest = [{"w": np.array(p, dtype=float)} for p in ([0, 0], [1, 0], [0, 1], [1, 1])]
    outlier = {"w": np.array([1e6, -1e6])}
    median = geometric_median([*honest, outlier], [1] * 5)["w"]
    assert np.all(np.abs(median - 0.5) < 0.6)  # inside the honest square
    alone = geometric_median([{"w": np.array([2.0, 3.0])}] * 3, [5, 1, 1])["w"]
    np.testing.assert_allclose(alone, [2.0, 3.0])


# ------------------------------------------------------------------------ SignSGD
def test_signsgd_sends_one_bit_per_entry_and_the_mean_magnitude() -> None:
    from signsgd import SignSGD

    value = np.array([[0.5, -1.5, 0.0], [2.0, -0.25, 1.25]], dtype=np.float32)
    parts = SignSGD().encode(value)
    assert parts["signs"].dtype == np.uint8 and parts["signs"].shape == (1,)
    assert parts["scale"] == pytest.approx(np.abs(value).mean())
    decoded = SignSGD().decode("w", parts)
    assert decoded.dtype == np.float32 and decoded.shape == (2, 3)
    np.testing.assert_allclose(decoded, np.where(value >= 0, 1, -1) * np.abs(value).mean())


def test_signsgd_error_feedback_sends_all_of_the_updates_over_the_rounds() -> None:
    settings = CompressionSettings(up="signsgd:SignSGD")
    store = SessionStore()
    rng = np.random.default_rng(1)
    raw, sent = np.zeros(1000), np.zeros(1000)
    for _ in range(20):
        update = rng.normal(size=1000)
        raw += update
        payload = compress_update({"w": update}, settings, store, "run", "slot")
        assert payload["w#signsgd:SignSGD#signs"].nbytes == 125
        sent += decompress(payload)["w"]
    with store.use("run", "residual/slot") as session:
        residual = session.state.tensors["w"]
    np.testing.assert_allclose(sent + residual, raw, atol=1e-9)


GOOD = {"signs": np.packbits(np.array([1, 0, 1], dtype=bool)),
        "scale": np.asarray(0.5, dtype=np.float64), "shape": np.array([3], dtype=np.int64)}


@pytest.mark.parametrize(("change", "words"), [
    ({"signs": None}, "needs parts signs, scale and shape"),
    ({"extra": np.zeros(1)}, "needs parts signs, scale and shape"),
    ({"shape": np.array([-3], dtype=np.int64)}, "shape must be non-negative int64"),
    ({"shape": np.array([3.0])}, "shape must be non-negative int64"),
    ({"shape": np.array([1 << 20, 1 << 20], dtype=np.int64)}, "is too large"),
    ({"shape": np.array([30], dtype=np.int64)}, "needs 4 packed bytes for 30 entries"),
    ({"signs": np.zeros(1, dtype=np.int16)}, "packed bytes"),
    ({"scale": np.asarray(np.nan)}, "finite 0-d float"),
    ({"scale": np.asarray(-1.0)}, "finite 0-d float"),
    ({"scale": np.array([0.5, 0.5])}, "finite 0-d float"),
    ({"scale": np.asarray(1, dtype=np.int64)}, "finite 0-d float"),
], ids=["missing", "extra", "negative", "float-shape", "huge", "bytes", "dtype", "nan",
        "negative-scale", "scale-shape", "int-scale"])
def test_signsgd_refuses_malformed_parts(change, words) -> None:
    from signsgd import SignSGD

    parts = {**GOOD, **change}
    parts = {key: value for key, value in parts.items() if value is not None}
    with pytest.raises(ValueError, match=words):
        SignSGD().decode("w", parts)
    assert SignSGD().decode("w", GOOD).tolist() == [0.5, -0.5, 0.5]
