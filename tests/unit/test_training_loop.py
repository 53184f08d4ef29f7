"""The training loop a run shapes: learning-rate schedules, gradient clipping and mixed
precision of a torch model's steps (training/lr_schedule.py, training/models/loop.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.data.datasets import load_data
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.lr_schedule import Schedule, global_step
from thrift_trainer.training.models import objectives
from thrift_trainer.training.models.module_training import (
    LocalSteps,
    ModelSetup,
    mean_gradients,
    train_locally,
)
from thrift_trainer.training.models.names import GRAD
from thrift_trainer.training.models.settings import ModelSettings, ModelSettingsError
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.server_optim import make_server_optimizer
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.training.units import UnitJob

torch.set_num_threads(1)
LETTERS = DEFAULT_DATA_ROOT / "letters"
TABLE = {"format": "letters"}


# ------------------------------------------------------------------ schedules
def test_a_cosine_schedule_warms_up_linearly_then_falls_to_its_end():
    schedule = Schedule("warmup_cosine", total=110, warmup=10, end=0.1)
    assert [schedule.factor(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert schedule.factor(10) == pytest.approx(1.0)
    assert schedule.factor(10 + 99 // 2) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(
        math.pi * 49 / 99)))
    assert schedule.factor(109) == pytest.approx(0.1)
    assert schedule.factor(500) == pytest.approx(0.1)  # past the end: the last factor


def test_linear_and_step_schedules_at_chosen_steps():
    linear = Schedule("linear", total=11, end=0.0)
    assert [linear.factor(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    step = Schedule("step", total=100, every=30, gamma=0.5)
    assert [step.factor(s) for s in (0, 29, 30, 60, 99)] == pytest.approx(
        [1.0, 1.0, 0.5, 0.25, 0.125])
    assert Schedule("step", total=90).factor(30) == pytest.approx(0.1)  # every third
    assert Schedule().is_constant and not Schedule("constant", warmup=3).is_constant


def test_the_local_schedule_runs_across_rounds_by_global_step():
    assert global_step(1, 20, 0) == 0 and global_step(3, 20, 5) == 45


def _setup(**settings) -> ModelSetup:
    data = load_data("letters", LETTERS, DataSettings.from_mapping(TABLE))
    return ModelSetup("mlp_classifier", ModelSettings({"hidden": [8]}, **settings), data,
                      objectives.cross_entropy, objectives.error_rate)


def _rates_seen(setup: ModelSetup, local: LocalSteps) -> list[float]:
    """The rate of each local step, read off the optimizer as it steps."""
    seen: list[float] = []
    original = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    module = setup.build(seed=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.SGD, "step", step)
        train_locally(setup, module, np.arange(0, 64), local)
    return seen


def test_a_nodes_local_rate_follows_the_schedule_from_the_units_round():
    setup = _setup(lr_schedule="linear", lr_rounds=2, lr_end=0.0)
    local = LocalSteps("sgd", lr=0.1, batch_size=16, epochs=1, round=1)  # 4 steps a round
    first = _rates_seen(setup, local)
    second = _rates_seen(setup, dataclasses.replace(local, round=2))
    schedule = Schedule("linear", total=8)
    assert first + second == pytest.approx([0.1 * schedule.factor(s) for s in range(8)])
    assert second[-1] == pytest.approx(0.0)


def test_without_a_schedule_the_rate_is_the_configured_one():
    assert _rates_seen(_setup(), LocalSteps("sgd", lr=0.1, batch_size=16, epochs=1,
                                            round=7)) == [0.1] * 4


def test_sync_sgds_coordinator_rate_follows_the_schedule_over_its_steps():
    config = RunSpec.parse("sync_sgd", "mlp_classifier", "letters", json.dumps({
        "images_per_work_unit": 20, "num_workunits_per_update": 1, "units_per_iteration": 1,
        "optimizer": "sgd", "lr": 0.5, "model": {"args": {"hidden": [8]},
                                                 "lr_schedule": "step", "lr_rounds": 4,
                                                 "lr_step_every": 1, "lr_step_gamma": 0.5},
        "data": TABLE})).algorithm_config()
    algorithm = SyncSGD("mlp_classifier", SyncSGD.check_config("mlp_classifier", config),
                        LETTERS, "letters")
    weights = algorithm.initial_weights()
    rates = []
    for _ in range(3):
        weights = algorithm.apply(weights, {GRAD + n: np.zeros_like(v) for n, v in
                                            weights.items()})
        rates.append(algorithm.state.optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([0.5, 0.25, 0.125])
    restarted = SyncSGD("mlp_classifier", SyncSGD.check_config("mlp_classifier", config),
                        LETTERS, "letters")
    restarted.load_state_dict(algorithm.state_dict())  # a resumed run goes on where it was
    assert restarted.state.steps == 3


def test_the_server_optimizers_update_is_scaled_by_its_schedule_over_rounds():
    server = make_server_optimizer("avg")
    server.schedule = Schedule("constant", total=4, warmup=2)
    weights = {"w": np.zeros(2)}
    steps = []
    for _ in range(3):
        new = server.step(weights, {"w": np.ones(2)})
        steps.append(float(new["w"][0] - weights["w"][0]))
        weights = new
    assert steps == pytest.approx([0.5, 1.0, 1.0])


def test_delta_avg_takes_its_server_schedule_from_the_run():
    config = RunSpec.parse("delta_avg", "mlp_classifier", "letters", json.dumps({
        "units": 2, "model": {"args": {"hidden": [8]}, "server_lr_schedule": "linear",
                              "lr_rounds": 5}, "data": TABLE})).algorithm_config()
    algorithm = DeltaAveraging("mlp_classifier",
                               DeltaAveraging.check_config("mlp_classifier", config),
                               LETTERS, "letters")
    assert algorithm.optimizer.schedule == Schedule("linear", total=5)
    assert algorithm.model_description()["training"] == {"server_lr_schedule": "linear",
                                                         "lr_rounds": 5}


def test_the_client_spans_a_decaying_schedule_over_the_runs_rounds_and_sends_nothing_else():
    scheduled = load_run_config(None, ["run.model=mlp_classifier", "run.rounds=7",
                                       "run.lr_schedule=warmup_cosine"])
    assert scheduled.algorithm_config()["model"] == {"lr_schedule": "warmup_cosine",
                                                     "lr_rounds": 7}
    plain = load_run_config(None, ["run.model=mlp_classifier", "run.rounds=7"])
    assert "model" not in plain.algorithm_config()


@pytest.mark.parametrize(("settings", "message"), [
    ({"lr_schedule": "exp"}, "run.lr_schedule must be one of constant, warmup_cosine"),
    ({"lr_schedule": "linear"}, "run.lr_rounds must be at least 1"),
    ({"clip_norm": -1.0}, "run.clip_norm must be 0"),
    ({"precision": "fp8"}, "run.precision must be one of fp32, bf16, fp16"),
    ({"warmup_steps": "ten"}, "run.warmup_steps must be an integer"),
    ({"lr_end": 2.0}, r"run.lr_end must be in \[0, 1\]"),
])
def test_a_bad_loop_setting_is_refused_in_one_line(settings, message):
    with pytest.raises(ModelSettingsError, match=message):
        ModelSettings.from_mapping(settings)


def test_a_letters_mlp_run_refuses_the_torch_loop_keys():
    with pytest.raises(ValueError, match="run.clip_norm is for torch models"):
        load_run_config(None, ["run.clip_norm=1.0"])


# ------------------------------------------------------------------ clipping
def test_clipping_bounds_a_units_mean_gradient_to_the_norm():
    free, _ = mean_gradients(_setup(), _setup().build(seed=3), 0, 64, batch_size=16)
    clipped, _ = mean_gradients(_setup(clip_norm=0.01), _setup().build(seed=3), 0, 64,
                                batch_size=16)
    norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in clipped.values()))
    free_norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in free.values()))
    assert free_norm > 0.01 and norm == pytest.approx(0.01, rel=1e-3)
    for name, value in free.items():  # the same direction, shorter
        np.testing.assert_allclose(clipped[name], value * (norm / free_norm), rtol=1e-4,
                                   atol=1e-9)


def test_clipping_bounds_every_local_step():
    """With SGD at rate 1 and one step, the update is minus the (clipped) gradient."""
    local = LocalSteps("sgd", lr=1.0, batch_size=64, epochs=1)
    before = _setup().build(seed=2)
    start = {n: p.detach().clone() for n, p in before.named_parameters()}
    after, _ = train_locally(_setup(clip_norm=0.05), before, np.arange(0, 64), local)
    moved = math.sqrt(sum(float(torch.sum((torch.from_numpy(after[n]) - start[n]) ** 2))
                          for n in start))
    assert moved == pytest.approx(0.05, rel=1e-3)


# ------------------------------------------------------------------ precision
def test_bf16_trains_on_the_cpu_and_differs_from_fp32():
    local = LocalSteps("adam", lr=0.01, batch_size=32, epochs=1, seed=1)
    results = {}
    for precision in ("fp32", "bf16"):
        module = _setup().build(seed=4)
        results[precision] = train_locally(_setup(precision=precision), module,
                                           np.arange(0, 512), local)
    (fp32, loss32), (bf16, loss16) = results["fp32"], results["bf16"]
    assert math.isfinite(loss16) and loss16 == pytest.approx(loss32, rel=0.05)
    assert any(not np.array_equal(fp32[n], bf16[n]) for n in fp32)
    assert all(bf16[n].dtype == np.float32 for n in bf16)  # the weights stay fp32


def test_fp16_is_refused_on_the_cpu_naming_the_setting():
    with pytest.raises(ConfigError, match="run.precision fp16 needs a CUDA device"):
        train_locally(_setup(precision="fp16"), _setup().build(seed=1), np.arange(0, 8),
                      LocalSteps("sgd", lr=0.1, batch_size=8, epochs=1))


def test_a_delta_avg_unit_with_the_loop_settings_reports_its_round_to_the_schedule():
    config = RunSpec.parse("delta_avg", "mlp_classifier", "letters", json.dumps({
        "units": 2, "local_optimizer": "sgd", "model": {
            "args": {"hidden": [8]}, "lr_schedule": "linear", "lr_rounds": 1,
            "clip_norm": 1.0}, "data": TABLE})).algorithm_config()
    checked = DeltaAveraging.check_config("mlp_classifier", config)
    algorithm = DeltaAveraging("mlp_classifier", checked, LETTERS, "letters")
    weights = algorithm.initial_weights()
    unit = algorithm.plan_round(1)[0]
    outputs = [DeltaAveraging.run_unit(UnitJob("r", r, unit, "mlp_classifier", checked,
                                               weights, dataset="letters"), LETTERS)
               for r in (1, 2)]
    # round 2 lies past a 1-round linear schedule: its rate is 0, nothing moves
    assert any(np.any(v != 0) for v in outputs[0].update.values())
    assert all(np.all(outputs[1].update[n] == 0) for n in weights)
