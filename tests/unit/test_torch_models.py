"""Any torch model under sync_sgd and delta_avg, checked against plain torch."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.data.datasets import load_data
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.models import modules, objectives
from thrift_trainer.training.models.module_training import ModelSetup, mean_gradients
from thrift_trainer.training.models.names import BUFFER, GRAD
from thrift_trainer.training.models.settings import DataShape, ModelSettings
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.server_optim import make_server_optimizer
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.training.units import UnitJob, UnitResult, UnitSpec

torch.set_num_threads(1)
LETTERS = DEFAULT_DATA_ROOT / "letters"
TABLE = {"format": "letters"}


def _config(algorithm: str, own: dict, hidden: list[int] | None = None) -> dict:
    model = {"args": {"hidden": hidden or [8]}}
    return RunSpec.parse(algorithm, "mlp_classifier", "letters",
                         json.dumps({**own, "model": model, "data": TABLE})).algorithm_config()


def test_a_model_gets_the_data_arguments_it_declares_and_the_configuration_leaves_out():
    module = modules.build("mlp_classifier", {"hidden": [5]}, DataShape((4, 2), 3), seed=0)
    assert [tuple(p.shape) for p in module.parameters()] == [(5, 8), (5,), (3, 5), (3,)]


@pytest.mark.parametrize(("args", "message"), [
    ({"width": 3}, "takes no argument 'width'"),
    ({"hidden": [-1]}, "could not be built with"),
])
def test_a_model_that_cannot_be_built_is_refused_naming_it(args, message):
    with pytest.raises(PluginError, match=f"mlp_classifier.*{message}|{message}"):
        modules.build("mlp_classifier", args, DataShape((4,), 3))


def test_the_fingerprint_follows_names_and_shapes_not_values():
    shape = DataShape((16,), 26)
    a = modules.build("mlp_classifier", {}, shape, seed=1)
    b = modules.build("mlp_classifier", {}, shape, seed=2)
    wider = modules.build("mlp_classifier", {"hidden": [65]}, shape, seed=1)
    assert modules.fingerprint(a) == modules.fingerprint(b) != modules.fingerprint(wider)


def test_weights_travel_under_their_state_dict_names_and_come_back_unchanged():
    source = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    arrays = modules.state_arrays(source)
    assert set(arrays) == set(source.state_dict())
    modules.load_arrays(target, arrays)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value)
    with pytest.raises(ValueError, match=r"tensor '0.weight' has shape \(2, 2\)"):
        modules.load_arrays(target, {**arrays, "0.weight": np.zeros((2, 2), np.float32)})


def test_a_sequence_of_class_scores_is_scored_per_position():
    model = nn.Linear(3, 5)  # (B, T, 3) -> (B, T, 5)
    inputs, targets = torch.randn(2, 4, 3), torch.randint(0, 5, (2, 4))
    expected = F.cross_entropy(model(inputs).reshape(8, 5), targets.reshape(8))
    assert torch.allclose(objectives.cross_entropy(model, inputs, targets), expected)
    wrong = (model(inputs).argmax(-1) != targets).float().mean()
    assert objectives.error_rate(model, inputs, targets) == pytest.approx(float(wrong))


class _Counted(nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


@pytest.mark.parametrize(("metric", "loss", "classes"), [
    (objectives.error_rate, objectives.cross_entropy, True),
    (objectives.mse_metric, objectives.mse, False)])
def test_a_built_in_metric_and_loss_are_scored_from_one_forward_pass(metric, loss, classes):
    model = _Counted(3, 4)
    inputs = torch.randn(6, 3)
    targets = torch.randint(0, 4, (6,)) if classes else torch.randn(6, 4)
    with torch.no_grad():  # as evaluate() scores: no graph kept
        expected = (float(metric(model, inputs, targets)), float(loss(model, inputs, targets)))
        model.calls = 0
        assert objectives.metric_and_loss(metric, loss, model, inputs, targets) == expected
        assert model.calls == 1
        own = objectives.metric_and_loss(lambda m, x, y: 0.25, loss, model, inputs, targets)
    assert own == (0.25, expected[1]) and model.calls == 2  # a metric of one's own: its call


def test_a_loss_that_is_not_a_finite_number_is_refused_with_its_name():
    with pytest.raises(objectives.LossError, match="loss my:step is nan"):
        objectives.checked_loss(torch.tensor(math.nan), "my:step")
    with pytest.raises(objectives.LossError, match="must return a 0-d tensor"):
        objectives.checked_loss(torch.ones(2), "my:step")


def _setup(hidden: int = 8) -> ModelSetup:
    data = load_data("letters", LETTERS, DataSettings.from_mapping(TABLE))
    return ModelSetup("mlp_classifier", ModelSettings({"hidden": [hidden]}), data,
                      objectives.cross_entropy, objectives.error_rate)


def test_the_mean_gradient_over_micro_batches_is_the_whole_units_gradient():
    setup = _setup()
    module = setup.build(seed=3)
    update, loss = mean_gradients(setup, module, 100, 160, batch_size=16)
    inputs, targets = setup.data.train.take(np.arange(100, 160))
    whole = F.cross_entropy(module(inputs), targets)
    grads = torch.autograd.grad(whole, list(module.parameters()))
    for (name, _), grad in zip(module.named_parameters(), grads, strict=True):
        np.testing.assert_allclose(update[GRAD + name], grad.numpy(), rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(float(whole.detach()), rel=1e-5)


def test_batchnorm_statistics_come_back_as_buffers_after_the_pass():
    setup = _setup()
    module = nn.Sequential(nn.Linear(16, 4), nn.BatchNorm1d(4), nn.Linear(4, 26))
    update, _ = mean_gradients(setup, module, 0, 64, batch_size=32)
    assert {BUFFER + "1.running_mean", BUFFER + "1.num_batches_tracked"} <= set(update)
    assert int(update[BUFFER + "1.num_batches_tracked"]) == 2


def test_one_sync_sgd_round_with_k_of_n_all_is_one_adam_step_on_the_global_batch():
    config = _config("sync_sgd", {"images_per_work_unit": 50, "num_workunits_per_update": 2,
                                  "units_per_iteration": 2, "lr": 0.01, "seed": 4})
    algorithm = SyncSGD("mlp_classifier", config, LETTERS, "letters")
    weights = algorithm.initial_weights()
    units = algorithm.plan_round(1)
    results = [_computed(SyncSGD, algorithm, unit, weights) for unit in units]
    stepped = algorithm.aggregate(1, weights, results, [])

    reference = modules.build("mlp_classifier", {"hidden": [8]}, DataShape((16,), 26), seed=4)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    inputs, targets = algorithm.state.setup.data.train.take(np.arange(0, 100))
    F.cross_entropy(reference(inputs), targets).backward()
    optimizer.step()
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(stepped[name], value.numpy(), rtol=1e-5, atol=1e-6)


def _sync_round(seed: int = 4) -> tuple[SyncSGD, dict, list[UnitResult]]:
    config = _config("sync_sgd", {"images_per_work_unit": 50, "num_workunits_per_update": 2,
                                  "units_per_iteration": 2, "lr": 0.01, "seed": seed})
    algorithm = SyncSGD("mlp_classifier", config, LETTERS, "letters")
    weights = algorithm.initial_weights()
    return algorithm, weights, [_computed(SyncSGD, algorithm, unit, weights)
                                for unit in algorithm.plan_round(1)]


def test_sync_sgd_steps_its_model_in_place_on_the_mean_made_as_adam_takes_it():
    algorithm, weights, results = _sync_round()
    whole, whole_weights, _ = _sync_round()
    # the mean combined whole, then applied: the path of any other rule
    expected = whole.apply(whole_weights, whole.combine(results))
    stepped = algorithm.aggregate(1, weights, results, [])
    assert stepped is not weights  # a new version is a new dict...
    module = dict(algorithm.state.module.named_parameters())
    for name, value in stepped.items():
        assert np.array_equal(value, expected[name])  # the same bits
        # ...of views of the model itself: a big model is held once
        assert np.shares_memory(value, module[name].detach().numpy())
        assert module[name].grad is None


def test_an_asynchronous_run_gets_a_copy_of_each_version():
    algorithm, weights, results = _sync_round()
    before = {name: value.copy() for name, value in weights.items()}
    algorithm.keep_each_version()
    stepped = algorithm.aggregate(1, weights, results, [])
    for name, value in weights.items():  # a version handed out keeps its values
        assert np.array_equal(value, before[name])
        assert not np.array_equal(stepped[name], before[name])
    again = algorithm.aggregate(2, stepped, results, [])
    assert all(not np.shares_memory(again[name], stepped[name]) for name in again)


def test_a_node_computes_on_the_received_weights_without_copying_them():
    setup = _setup()
    module = nn.Sequential(nn.Linear(16, 4), nn.BatchNorm1d(4), nn.Linear(4, 26))
    received = {name: _as_received(value.detach().numpy() + (1.0 if value.is_floating_point()
                                                              else 0))
                for name, value in module.state_dict().items()}
    lent = modules.lendable(module, received)
    assert set(lent) == {name for name, _ in module.named_parameters()}
    with modules.lent(module, lent):
        for name, param in module.named_parameters():
            assert np.shares_memory(param.detach().numpy(), received[name])
        assert torch.equal(module[1].running_mean, torch.ones(4))  # buffers copied in
        update, _ = mean_gradients(setup, module, 0, 64, batch_size=32)
    for name, param in module.named_parameters():
        assert not np.shares_memory(param.detach().numpy(), received[name])
        assert param.grad is None  # the update holds the gradient, not the module
        assert update[GRAD + name].shape == received[name].shape
    with modules.lent(module, modules.lendable(module, received)):
        again, _ = mean_gradients(setup, module, 0, 64, batch_size=32)
    for name in update:
        if name.startswith(GRAD):
            assert np.array_equal(again[name], update[name])


def _as_received(array: np.ndarray) -> np.ndarray:
    """A read-only view of a writable buffer, as a received message's tensors are."""
    received = np.frombuffer(bytearray(array.tobytes()), array.dtype).reshape(array.shape)
    received.flags.writeable = False
    return received


def test_one_delta_avg_round_of_full_batch_steps_is_the_mean_of_the_local_trainings():
    config = _config("delta_avg", {"epochs": 2, "eta": 0.1, "units": 2, "seed": 5,
                                   "local_optimizer": "gd"})
    algorithm = DeltaAveraging("mlp_classifier", config, LETTERS, "letters")
    weights = algorithm.initial_weights()
    units = algorithm.plan_round(1)
    assert [(u.index_start, u.index_stop) for u in units] == [(0, 8250), (8250, 16500)]
    results = [_computed(DeltaAveraging, algorithm, unit, weights) for unit in units]
    new = algorithm.aggregate(1, weights, results, [])

    trained = []
    data = algorithm._plan.state.setup.data
    for unit in units:
        local = modules.build("mlp_classifier", {"hidden": [8]}, DataShape((16,), 26))
        modules.load_arrays(local, weights)
        optimizer = torch.optim.SGD(local.parameters(), lr=0.1)
        inputs, targets = data.train.take(np.arange(unit.index_start, unit.index_stop))
        for _ in range(2):
            optimizer.zero_grad()
            F.cross_entropy(local(inputs), targets).backward()
            optimizer.step()
        trained.append(modules.state_arrays(local))
    for name in weights:
        np.testing.assert_allclose(new[name], (trained[0][name] + trained[1][name]) / 2,
                                   rtol=1e-5, atol=1e-6)


def test_a_relays_local_rounds_add_changes_and_install_buffers():
    before = {"w": np.array([1.0]), "bn.running_mean": np.array([0.0])}
    update = {"w": np.array([0.5]), BUFFER + "bn.running_mean": np.array([3.0])}
    after = DeltaAveraging.add_update(before, update)
    assert after == {"w": np.array([1.5]), "bn.running_mean": np.array([3.0])}
    back = DeltaAveraging.update_between(before, after, update)
    assert back == {"w": np.array([0.5]), BUFFER + "bn.running_mean": np.array([3.0])}


def test_the_nesterov_server_step_is_torch_sgd_with_nesterov_on_the_pseudo_gradient():
    server = make_server_optimizer("nesterov", lr=0.7, beta=0.9)
    param = torch.zeros(3, requires_grad=True)
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    weights = {"w": np.zeros(3)}
    for delta in (np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.1, -1.0])):
        weights = server.step(weights, {"w": delta})
        param.grad = torch.from_numpy(-delta).float()
        sgd.step()
        np.testing.assert_allclose(weights["w"], param.detach().numpy(), rtol=1e-6)


def _computed(cls, algorithm, unit: UnitSpec, weights) -> UnitResult:
    job = UnitJob("r", 1, unit, algorithm.model, algorithm.config, weights,
                  dataset="letters")
    output = cls.run_unit(job, LETTERS)
    return UnitResult(unit, output.update, output.num_samples, output.loss)
