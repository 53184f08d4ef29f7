"""Synchronous SGD: both halves in process, against single-process references."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

from tests.inprocess import LocalNode
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.tasks import Task
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.base import combine
from thrift_trainer.training.algorithms.sync_gan import unit_noise
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.data import mnist
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import gan_models, mlp
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitJob, UnitResult, UnitSpec, Weights

torch.set_num_threads(1)

LETTERS = DEFAULT_DATA_ROOT / "letters"
MNIST = DEFAULT_DATA_ROOT / "mnist"
TOLERANCE = 1e-5  # max |a - b| / max |b|, per tensor (GAN gradients: per network)


def run_round(algorithm: SyncSGD, round_index: int, weights: Weights,
              units: list[UnitSpec] | None = None) -> Weights:
    """The node half on every given unit (all planned ones by default), combined as a run
    does by default (the weighted mean); returns the average."""
    results = []
    for unit in units or algorithm.plan_round(round_index):
        job = UnitJob("run", round_index, unit, algorithm.model, algorithm.config, weights)
        output = SyncSGD.run_unit(job, algorithm.dataset_dir)
        results.append(UnitResult(unit, output.update, output.num_samples))
    return combine(defaults(AggregationSettings), results)


def max_relative_difference(actual: Mapping[str, np.ndarray],
                            expected: Mapping[str, np.ndarray]) -> float:
    assert sorted(actual) == sorted(expected)
    return max(float(np.max(np.abs(actual[k] - expected[k])) / max(np.max(np.abs(expected[k])),
                                                                   1e-30))
               for k in expected)


def max_difference_per_network(actual: Mapping[str, np.ndarray],
                               expected: Mapping[str, np.ndarray]) -> float:
    """max |a - b| relative to the largest gradient of the same network (G or D).

    Per tensor is too strict for float32 sums whose terms cancel: D's output bias gets
    about +-0.5 from every real and fake sample and nets 1e-3, so summation order alone
    moves it by 3e-5 of itself, yet by 2e-6 of D's largest gradient.
    """
    worst = 0.0
    for network in ("grad.G.", "grad.D."):
        names = [k for k in expected if k.startswith(network)]
        scale = max(float(np.max(np.abs(expected[k]))) for k in names)
        worst = max(worst, *(float(np.max(np.abs(actual[k] - expected[k]))) / scale
                             for k in names))
    return worst


def probe_reference(algorithm: SyncSGD, weights: Weights) -> tuple[float, float]:
    """The GAN's per-round evaluation computed here with plain torch: D in eval mode (BN
    from the running statistics in ``weights``) on the probe's real images and on G's
    fakes from the probe noise (seed 12345); error = misclassified / all, loss = the sum
    of the two binary cross-entropies."""
    probe = algorithm.state.probe
    g, d = gan_models.build_gan(algorithm.state.spec)
    gan_models.numpy_to_state(g, weights, "G.")
    gan_models.numpy_to_state(d, weights, "D.")
    g.eval()
    d.eval()
    z = torch.randn(len(probe), algorithm.state.spec.z_dim,
                    generator=torch.Generator().manual_seed(12345))
    with torch.no_grad():
        real, fake = d(probe), d(g(z))
    wrong = int((real <= 0).sum() + (fake > 0).sum())
    loss = (F.binary_cross_entropy_with_logits(real, torch.ones_like(real))
            + F.binary_cross_entropy_with_logits(fake, torch.zeros_like(fake)))
    return wrong / (2 * len(probe)), float(loss)


# ------------------------------------------------------------------ (1) equivalence


def test_registered() -> None:
    assert get_algorithm("sync_sgd") is SyncSGD


def test_gan_round_equals_one_adam_step_on_the_global_batch() -> None:
    config = {"images_per_work_unit": 24, "num_workunits_per_update": 3,
              "units_per_iteration": 3, "batch_size": 10, "batchnorm": False, "seed": 7}
    algorithm = SyncSGD("dcgan28-tiny", config, MNIST)
    units = algorithm.plan_round(1)
    average = run_round(algorithm, 1, algorithm.initial_weights())
    new_weights = algorithm.apply(algorithm.initial_weights(), average)

    spec = gan_models.gan_spec("dcgan28-tiny", batchnorm=False)
    g, d = gan_models.build_gan(spec, seed=7)
    real = mnist.training_range(0, 72, MNIST)
    z = torch.cat([unit_noise(spec.z_dim, 24, 7, 1, u.unit_id) for u in units])
    fake = g(z)
    real_logits, fake_logits = d(real), d(fake)
    d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones(72))
              + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros(72)))
    g_loss = F.binary_cross_entropy_with_logits(fake_logits, torch.ones(72))
    d_grads = torch.autograd.grad(d_loss, list(d.parameters()), retain_graph=True)
    g_grads = torch.autograd.grad(g_loss, list(g.parameters()))
    expected_grads = {}
    for prefix, module, grads in (("G.", g, g_grads), ("D.", d, d_grads)):
        for (name, param), grad in zip(module.named_parameters(), grads, strict=True):
            param.grad = grad
            expected_grads[f"grad.{prefix}{name}"] = grad.numpy()
        torch.optim.Adam(module.parameters(), lr=2e-4, betas=(0.5, 0.999)).step()
    expected = {**gan_models.state_to_numpy(g, "G."), **gan_models.state_to_numpy(d, "D.")}

    assert sorted(average) == sorted(expected_grads)
    grad_difference = max_difference_per_network(average, expected_grads)
    weight_difference = max_relative_difference(new_weights, expected)
    assert grad_difference < TOLERANCE, (
        f"GAN gradients: max relative difference {grad_difference:.2e} per network "
        f"({max_relative_difference(average, expected_grads):.2e} per tensor)")
    assert weight_difference < TOLERANCE, (
        f"GAN weights after Adam: max relative difference {weight_difference:.2e}")


def torch_mlp_mean_gradients(params: Weights, features: np.ndarray,
                             labels: np.ndarray) -> Weights:
    """An independent reference: torch autograd on the mean cross-entropy of the batch."""
    leaves = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in params.items()}
    hidden = torch.tensor(features / mlp.FEATURE_MAX)
    for name in ("W", "W2"):
        hidden = torch.relu(hidden @ leaves[name][1:] + leaves[name][0])
    logits = hidden @ leaves["V"][1:] + leaves["V"][0]
    F.cross_entropy(logits, torch.tensor(labels)).backward()
    return {f"grad.{k}": v.grad.numpy().astype(np.float32) for k, v in leaves.items()}


def test_mlp_round_equals_one_adam_step_on_the_global_batch() -> None:
    config = {"images_per_work_unit": 100, "num_workunits_per_update": 3,
              "units_per_iteration": 3, "batch_size": 32, "hidden": [16, 16], "lr": 0.01}
    algorithm = SyncSGD("mlp", config, LETTERS)
    initial = algorithm.initial_weights()
    average = run_round(algorithm, 1, initial)
    new_weights = algorithm.apply(initial, average)

    features, labels = load_letters(LETTERS / "train_letters1.txt")
    expected_grads = torch_mlp_mean_gradients(initial, features[:300], labels[:300])
    params = [torch.tensor(initial[k], requires_grad=True) for k in ("W", "W2", "V")]
    for param, name in zip(params, ("W", "W2", "V"), strict=True):
        param.grad = torch.from_numpy(expected_grads[f"grad.{name}"])
    torch.optim.Adam(params, lr=0.01, betas=(0.9, 0.999)).step()
    expected = {name: p.detach().numpy() for name, p in zip(("W", "W2", "V"), params,
                                                              strict=True)}

    grad_difference = max_relative_difference(average, expected_grads)
    weight_difference = max_relative_difference(new_weights, expected)
    assert grad_difference < TOLERANCE, (
        f"MLP gradients: max relative difference {grad_difference:.2e}")
    assert weight_difference < TOLERANCE, (
        f"MLP weights after Adam: max relative difference {weight_difference:.2e}")


# ------------------------------------------------------------------ (2) planning


def test_quorum_is_k_and_units_walk_the_data_set_in_order_and_wrap() -> None:
    config = {"images_per_work_unit": 5000, "num_workunits_per_update": 2,
              "units_per_iteration": 3}
    algorithm = SyncSGD("mlp", config, LETTERS)  # 11 x 1500 = 16,500 rows: 4 units/epoch
    assert algorithm.quorum(3) == 2
    ranges = [(u.index_start, u.index_stop) for r in (1, 2) for u in algorithm.plan_round(r)]
    assert ranges == [(0, 5000), (5000, 10000), (10000, 15000),
                      (15000, 16500), (0, 5000), (5000, 10000)]
    units = algorithm.plan_round(2)
    assert [u.unit_path for u in units] == ["train_letters11.txt", "train_letters1.txt",
                                            "train_letters4.txt"]
    assert len({u.unit_id for r in (1, 2) for u in algorithm.plan_round(r)}) == 6


def test_defaults_follow_the_reference_design() -> None:
    algorithm = SyncSGD("dcgan28-tiny", {}, MNIST)
    units = algorithm.plan_round(1)
    assert algorithm.quorum(len(units)) == 3 and len(units) == 4
    assert [(u.index_start, u.index_stop) for u in units][-1] == (960, 1280)
    assert {u.unit_path for u in units} == {mnist.IMAGES_FILE}
    assert SyncSGD.check_config("mlp", {"num_workunits_per_update": 5})["units_per_iteration"] == 6


def test_samples_and_scores_come_from_the_weights_given() -> None:
    """A saved generator is sampled and scored as it was saved, whatever the algorithm
    object stepped last (a bench publishes grids from kept states this way)."""
    saved, other = SyncSGD("dcgan28", {"seed": 1}, MNIST), SyncSGD("dcgan28", {"seed": 2}, MNIST)
    weights = saved.initial_weights()
    expected = saved.sample_images(weights, 8, seed=3)
    assert not np.array_equal(other.sample_images(other.initial_weights(), 8, seed=3), expected)
    np.testing.assert_array_equal(other.sample_images(weights, 8, seed=3), expected)
    assert other.score(weights, 50) == saved.score(weights, 50)


# ------------------------------------------------------------------ (3) configuration


@pytest.mark.parametrize(("model", "config", "message"), [
    ("dcgan28", {"lr_g": "fast"}, "'lr_g' must be a number"),
    ("dcgan28", {"batchnorm": 1}, "'batchnorm' must be a boolean (true or false)"),
    ("dcgan64", {"images_per_work_unit": 32.0}, "'images_per_work_unit' must be an integer"),
    ("dcgan28", {"lr_gen": 0.1}, "unknown config key 'lr_gen'"),
    ("mlp", {"hidden": [0]}, "'hidden' must be a list of positive integers"),
    ("mlp", {"seed": True}, "'seed' must be an integer"),
    ("mlp", {"units_per_iteration": 2}, "'units_per_iteration' (N) must be at least"),
    ("mlp", {"batch_size": 0}, "'batch_size' must be at least 1"),
    ("dcgan28", {"beta1": 1.0}, "'beta1' must be in [0, 1)"),
    ("resnet", {}, "cannot train model 'resnet'"),
])
def test_check_config_names_the_key(model: str, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SyncSGD.check_config(model, config)
    assert message in str(caught.value)


def test_keys_for_the_other_kind_of_model_are_dropped() -> None:
    # One config file serves every model: a GAN run ignores the MLP's keys and back.
    assert "lr" not in SyncSGD.check_config("dcgan28", {"lr": 0.1, "hidden": [4]})
    assert "lr_g" not in SyncSGD.check_config("mlp", {"lr_g": 0.1, "batchnorm": False})


def test_a_unit_without_an_index_range_is_refused() -> None:
    algorithm = SyncSGD("mlp", {"hidden": [8]}, LETTERS)
    job = UnitJob("run", 1, UnitSpec("u", "train_letters1.txt"), "mlp", algorithm.config,
                  algorithm.initial_weights())
    with pytest.raises(ConfigError, match="index range"):
        SyncSGD.run_unit(job, LETTERS)


# ------------------------------------------------------------------ (4) BatchNorm


def test_batchnorm_statistics_are_averaged_into_the_weights() -> None:
    config = {"images_per_work_unit": 16, "num_workunits_per_update": 2,
              "units_per_iteration": 2, "batch_size": 8}
    algorithm = SyncSGD("dcgan28-tiny", config, MNIST)
    initial = algorithm.initial_weights()
    average = run_round(algorithm, 1, initial)
    weights = algorithm.apply(initial, average)
    buffers = [k for k in weights if k.endswith(("running_mean", "running_var"))]
    assert buffers and all(f"buffer.{k}" in average for k in buffers)
    for name in buffers:
        np.testing.assert_allclose(weights[name], average[f"buffer.{name}"], rtol=1e-6)
        assert not np.allclose(weights[name], initial[name])
    counters = {k: v for k, v in weights.items() if k.endswith("num_batches_tracked")}
    # Two micro-batches per unit: G runs twice, D twice on reals and twice on fakes.
    assert {k: float(v) for k, v in counters.items()} == {
        "G.project.1.num_batches_tracked": 2.0, "G.upsample.1.num_batches_tracked": 2.0,
        "D.net.3.num_batches_tracked": 4.0}
    # the evaluation scores the averaged model, BN from its averaged statistics
    evaluation = algorithm.evaluate(weights)
    error, loss = probe_reference(algorithm, weights)
    assert evaluation.validation_error == error
    assert evaluation.validation_loss == pytest.approx(loss, rel=1e-5)


# ------------------------------------------------------------------ (5) training


def test_a_few_mlp_rounds_reduce_the_validation_error() -> None:
    algorithm = SyncSGD("mlp", {}, LETTERS)  # K = 3 of N = 4 units of 320 rows
    weights = algorithm.initial_weights()
    first = algorithm.evaluate(weights).validation_error
    for round_index in range(1, 11):
        arrived = algorithm.plan_round(round_index)[::-1][:algorithm.quorum(4)]  # K of N
        weights = algorithm.apply(weights, run_round(algorithm, round_index, weights, arrived))
    last = algorithm.evaluate(weights).validation_error
    assert last < first - 0.3, (first, last)
    state = algorithm.state_dict()
    assert float(state["optim.mlp.W.step"]) == 10.0
    assert state["optim.mlp.V.exp_avg"].shape == weights["V"].shape


def test_weights_keep_the_model_order_and_float32(tmp_path: Path) -> None:
    algorithm = SyncSGD("dcgan28-tiny", {"images_per_work_unit": 8, "batch_size": 8}, MNIST)
    initial = algorithm.initial_weights()
    weights = algorithm.apply(initial, run_round(algorithm, 1, initial))
    assert list(weights) == list(initial)
    assert all(v.dtype == np.float32 for v in weights.values())


def test_dcgan64_trains_on_an_image_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for index in range(6):
        pixels = rng.integers(0, 256, (70, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"img{index}.png")
    config = {"images_per_work_unit": 4, "num_workunits_per_update": 2,
              "units_per_iteration": 2, "batch_size": 4}
    algorithm = SyncSGD("dcgan64-tiny", config, tmp_path)
    units = algorithm.plan_round(1)
    assert [(u.unit_path, u.index_start, u.index_stop) for u in units] == [
        ("img0.png", 0, 4), ("img4.png", 4, 6)]
    initial = algorithm.initial_weights()
    weights = algorithm.apply(initial, run_round(algorithm, 1, initial))
    assert not np.allclose(weights["G.net.0.weight"], initial["G.net.0.weight"])
    evaluation = algorithm.evaluate(weights)
    error, loss = probe_reference(algorithm, weights)  # the folder's 6 images as the probe
    assert evaluation.validation_error == error
    assert evaluation.validation_loss == pytest.approx(loss, rel=1e-5)


def test_a_round_through_the_engine_and_node_handlers() -> None:
    """The wire path: the handler checks unit_path and decodes the range; K of N end it."""

    config = {"images_per_work_unit": 16, "num_workunits_per_update": 2,
              "units_per_iteration": 3, "batch_size": 8}
    algorithm = SyncSGD("dcgan28-tiny", config, MNIST)
    weights = algorithm.initial_weights()

    def build(unit: UnitSpec, attempt: int) -> Task:
        return Task(
            run_id="r1", round=1, unit_id=unit.unit_id,
            attempt=attempt, algorithm="sync_sgd", model="dcgan28-tiny", dataset="mnist",
            unit_path=unit.unit_path, config_json=json.dumps(algorithm.config),
            weights=weights, scheduling_policy=2,
            index_start=unit.index_start, index_stop=unit.index_stop)

    nodes = [LocalNode(i) for i in range(2)]
    progress = RunProgress("r1", 1, 3, lambda: [n.summary() for n in nodes])
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(), progress,
                         threading.Event())
    units = algorithm.plan_round(1)
    outcome = engine.run_round(1, units, algorithm.quorum(len(units)), build)
    assert outcome.completed == 2
    new_weights = algorithm.aggregate(1, weights, outcome.results, outcome.failures)
    assert list(new_weights) == list(weights)


def test_a_gan_step_given_its_last_weights_skips_their_reload_with_the_same_bits() -> None:
    """The coordinator's G and D already hold the weights its last step returned: the
    next step does not load them again, and ends where a step that loads copies ends;
    weights loaded for anything else in between are loaded again for the step."""
    config = {"images_per_work_unit": 8, "batch_size": 8, "num_workunits_per_update": 1,
              "units_per_iteration": 1}
    chained, loading = SyncSGD("dcgan28-tiny", config, MNIST), SyncSGD("dcgan28-tiny", config,
                                                                       MNIST)
    start = chained.initial_weights()
    rng = np.random.default_rng(2)
    averages = [{name: np.abs(rng.normal(size=spec[0])).astype(np.float32) * 1e-2
                 for name, spec in chained.expected_update(start).items()}
                for _ in range(3)]
    for average in averages:  # BN's counter stays a count
        for name in average:
            if name.endswith("num_batches_tracked"):
                average[name] = np.float32(3)
    mine, theirs = start, {k: v.copy() for k, v in start.items()}
    for i, average in enumerate(averages):
        if i == 1:  # other weights loaded meanwhile (a saved state's images)
            chained.sample_images(start, 4)
        mine = chained.apply(mine, average)
        theirs = loading.apply({k: v.copy() for k, v in theirs.items()}, average)
        assert mine.keys() == theirs.keys()
        assert all(mine[k].tobytes() == theirs[k].tobytes() for k in mine)
    before = {k: v.copy() for k, v in mine.items()}
    chained.evaluate(mine)
    assert all(mine[k].tobytes() == before[k].tobytes() for k in mine)  # read, not written


def test_a_gan_units_gradients_are_its_own_arrays() -> None:
    """A node hands out the gradient sums themselves, not copies: the next unit's maths
    must not touch the arrays of the one before."""
    config = {"images_per_work_unit": 8, "batch_size": 4, "num_workunits_per_update": 1,
              "units_per_iteration": 1}
    algorithm = SyncSGD("dcgan28-tiny", config, MNIST)
    weights = algorithm.initial_weights()
    first, second = algorithm.plan_round(1)[0], algorithm.plan_round(2)[0]
    out = SyncSGD.run_unit(UnitJob("r", 1, first, "dcgan28-tiny", config, weights), MNIST)
    kept = {k: v.copy() for k, v in out.update.items()}
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in out.update.values())
    SyncSGD.run_unit(UnitJob("r", 2, second, "dcgan28-tiny", config, weights), MNIST)
    assert all(out.update[k].tobytes() == kept[k].tobytes() for k in kept)


def test_a_gan_unit_reads_its_weights_as_received() -> None:
    assert not SyncSGD.writes_weights("dcgan28") and SyncSGD.writes_weights("mlp")
    config = {"images_per_work_unit": 8, "batch_size": 8, "num_workunits_per_update": 1,
              "units_per_iteration": 1}
    algorithm = SyncSGD("dcgan28-tiny", config, MNIST)
    weights = algorithm.initial_weights()
    for value in weights.values():
        value.flags.writeable = False  # a node's views of the message
    unit = algorithm.plan_round(1)[0]
    SyncSGD.run_unit(UnitJob("r", 1, unit, "dcgan28-tiny", config, weights), MNIST)
