"""FL-GAN in process: configuration, a node's local training, the sample-weighted average."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.gan_training import shard_indices
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.units import UnitJob, UnitResult

torch.set_num_threads(1)

MNIST = DEFAULT_DATA_ROOT / "mnist"
# Three workers cut the 8,000 training images into shards of 2,667, 2,667 and 2,666.
CONFIG = {"workers": 3, "batch_size": 512, "seed": 2}


def test_registered_with_the_documented_defaults() -> None:
    assert get_algorithm("fl_gan") is FLGan
    config = FLGan.check_config("dcgan28", {})
    assert (config["workers"], config["local_epochs"], config["batch_size"]) == (4, 1, 64)
    section = load_run_config(None, ["run.algorithm=fl_gan", "run.model=dcgan28"])
    assert FLGan.check_config("dcgan28", section.algorithm_config()) == config


@pytest.mark.parametrize(("config", "message"), [
    ({"local_epochs": 0}, "'local_epochs' must be positive"),
    ({"epochs": 1}, "unknown config key 'epochs'"),
    ({"lr": 0}, "'lr' must be positive"),
])
def test_bad_configs_name_the_key(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FLGan.check_config("dcgan28-tiny", config)


def test_shards_are_disjoint_and_cover_the_training_part() -> None:
    shards = [shard_indices(8000, slot, 3, 2) for slot in range(3)]
    assert [len(s) for s in shards] == [2667, 2667, 2666]
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(8000))


def test_the_average_of_whole_states_weights_buffers_by_samples() -> None:
    """Every node returns G's and D's parameters and BN buffers after its local epoch; the
    next global model is their average weighted by shard size, running statistics too."""
    algorithm = FLGan("dcgan28-tiny", CONFIG, MNIST)
    weights = algorithm.initial_weights()
    outputs = [FLGan.run_unit(UnitJob("r", 1, unit, algorithm.model, algorithm.config, weights),
                              MNIST) for unit in algorithm.plan_round(1)]
    assert [o.num_samples for o in outputs] == [2667, 2667, 2666]
    assert sorted(outputs[0].update) == sorted(weights)
    results = [UnitResult(unit, output.update, output.num_samples)
               for unit, output in zip(algorithm.plan_round(1), outputs, strict=True)]
    new = algorithm.aggregate(1, weights, results, [])

    for name in ("G.project.1.running_mean", "G.project.1.running_var",
                 "D.net.3.running_mean", "D.net.3.running_var", "G.project.0.weight"):
        expected = sum(o.update[name].astype(np.float64) * o.num_samples
                       for o in outputs) / 8000
        np.testing.assert_allclose(new[name], expected, rtol=1e-6, atol=1e-7)
    moved = new["G.project.1.running_var"] - weights["G.project.1.running_var"]
    assert np.abs(moved).max() > 1e-3  # the buffers did move away from their start
    assert new["D.net.3.num_batches_tracked"] == outputs[0].update["D.net.3.num_batches_tracked"]
    g, _ = gan_models.build_gan(algorithm.spec)
    gan_models.numpy_to_state(g, new, "G.")  # a loadable model
    assert algorithm.sample_images(new, 4).shape == (4, 1, 28, 28)


def test_buffers_are_weighted_by_samples_not_averaged_plainly() -> None:
    algorithm = FLGan("dcgan28-tiny", CONFIG, MNIST)
    weights = algorithm.initial_weights()
    small = {k: np.full_like(v, 1.0) for k, v in weights.items()}
    large = {k: np.full_like(v, 5.0) for k, v in weights.items()}
    units = algorithm.plan_round(1)
    new = algorithm.aggregate(1, weights, [UnitResult(units[0], small, 1000),
                                           UnitResult(units[1], large, 3000)], [])
    for name in ("G.project.1.running_mean", "G.project.1.running_var",
                 "D.net.3.running_mean", "D.net.3.running_var"):
        np.testing.assert_allclose(new[name], 4.0)  # (1 x 1000 + 5 x 3000) / 4000
    assert new["D.net.3.num_batches_tracked"] == 4.0


def test_a_state_that_does_not_fit_the_model_is_refused() -> None:
    algorithm = FLGan("dcgan28-tiny", CONFIG, MNIST)
    partial = {k: v for k, v in algorithm.initial_weights().items() if "running" not in k}
    with pytest.raises(ValueError, match="missing"):
        algorithm.apply(algorithm.initial_weights(), partial)
