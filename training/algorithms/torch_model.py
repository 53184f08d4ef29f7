"""Any torch model under sync_sgd and delta_avg: both halves of each algorithm's maths.

The built-in letters MLP and GANs keep their own paths (they reproduce published numbers
bit for bit); a model named by `run.model` that is a torch model of
training/models/modules.py (``mlp_classifier`` or a plug-in) trains here, on the data set
`run.dataset` names, read by training/data/datasets.py.

* sync_sgd: a node returns the mean gradient over its unit's examples (``grad.<name>``)
  and its buffers (``buffer.<name>``); the coordinator's optimizer (Adam, AdamW or SGD)
  steps on the average.
* delta_avg: a node trains locally (`LocalSteps`) and returns its parameters' change and
  its buffers; the coordinator's server optimizer (training/server_optim.py) applies the
  average change, e.g. Nesterov momentum for DiLoCo.

Units are index ranges of the training part in both.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from thrift_trainer.training import aggregation, server_optim
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.data_parts import Subset
from thrift_trainer.training.data.paths import folder_stamp
from thrift_trainer.training.data.settings import SECTION as DATA
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.models import loop, modules
from thrift_trainer.training.models.module_training import (
    LocalSteps,
    ModelSetup,
    buffers_of,
    check_model_runs,
    evaluate,
    install_buffers,
    mean_gradients,
    mean_gradients_over,
    train_locally,
)
from thrift_trainer.training.models.names import BUFFER, GRAD
from thrift_trainer.training.models.settings import SECTION as MODEL
from thrift_trainer.training.models.settings import ModelSettings
from thrift_trainer.training.optimizer_blocks import step_in_blocks
from thrift_trainer.training.outputs.torch_files import load_weights as load_weights_file
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.units import RoundEval, UnitJob, UnitOutput, Weights, unit_seed

OPTIMIZERS = ("adam", "adamw", "sgd")
BETAS = (0.9, 0.999)


def setup_of(model: str, config: Mapping[str, Any], dataset: str,
             location: Path) -> ModelSetup:
    """The run's model, data, loss and metric, read once per process and run settings."""
    return _setup(model, json.dumps(config.get(MODEL) or {}, sort_keys=True), dataset,
                  str(location), json.dumps(config.get(DATA) or {}, sort_keys=True),
                  folder_stamp(location))


@functools.lru_cache(maxsize=4)
def _setup(model: str, model_json: str, dataset: str, location: str,
           data_json: str, stamp: tuple) -> ModelSetup:
    try:
        return ModelSetup.load(model, ModelSettings.from_mapping(json.loads(model_json)),
                               dataset, Path(location),
                               DataSettings.from_mapping(json.loads(data_json)))
    except PluginError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def job_setup(job: UnitJob, location: Path) -> ModelSetup:
    return setup_of(job.model, job.config, job.dataset, location)


def load_weights(module: nn.Module, weights: Weights, model: str) -> None:
    try:
        modules.load_arrays(module, weights)
    except ValueError as exc:
        raise ConfigError(f"weights do not fit {model}: {exc}") from None


@contextlib.contextmanager
def reading_weights(module: nn.Module, weights: Weights, model: str) -> Iterator[None]:
    """The module's parameters are the received ``weights`` themselves while the block
    computes a gradient from them (`modules.lendable`): a node holds a big model once."""
    try:
        tensors = modules.lendable(module, weights)
    except ValueError as exc:
        raise ConfigError(f"weights do not fit {model}: {exc}") from None
    with modules.lent(module, tensors):
        yield


# ------------------------------------------------------------------ sync_sgd
def sync_unit(job: UnitJob, location: Path, start: int, stop: int,
              batch_size: int) -> UnitOutput:
    """The mean gradient over examples ``[start, stop)`` of the training part."""
    setup = job_setup(job, location)
    _check_range(setup, start, stop)
    with setup.borrowed(job.device) as module, \
            reading_weights(module, job.weights, job.model):
        update, loss = mean_gradients(setup, module, start, stop, batch_size,
                                      job.control.step, job.device, _unit_seed(job))
    return UnitOutput(update=update, num_samples=stop - start, loss=loss, error=math.nan)


def sync_examples_unit(job: UnitJob, location: Path,
                       examples: Callable[[ModelSetup], np.ndarray],
                       batch_size: int) -> UnitOutput | None:
    """The mean gradient over the training part's ``examples(setup)`` (a federated
    client's batch); None when there are none (an empty share of a unit)."""
    setup = job_setup(job, location)
    chosen = examples(setup)
    if len(chosen) == 0:
        return None
    with setup.borrowed(job.device) as module, \
            reading_weights(module, job.weights, job.model):
        update, loss = mean_gradients_over(setup, module, chosen, batch_size,
                                           job.control.step, job.device, _unit_seed(job))
    return UnitOutput(update=update, num_samples=len(chosen), loss=loss, error=math.nan)


def _unit_seed(job: UnitJob) -> int:
    """The seed of a unit's data augmentation: its run's seed, round and unit."""
    return unit_seed(job.config.get("seed", 0), job.round, job.unit.seed_id)


class CoordinatorModel:
    """The coordinator's copy of a torch model: built once (from the run's seed or its
    `run.init_weights`) and run once on a few examples, so a model that cannot train is
    refused before round 1; it evaluates and describes the weights it is given."""

    def __init__(self, setup: ModelSetup, seed: int, batch_size: int) -> None:
        self.setup = setup
        self.module = built(setup, seed)
        check_model_runs(setup, self.module, batch_size)
        self.module.eval()
        self._holds: Weights | None = None  # the weights dict the module holds, if known

    def weights(self) -> Weights:
        """Copies of the module's state, which it then holds."""
        self._holds = modules.state_arrays(self.module)
        return self._holds

    def load(self, weights: Weights) -> None:
        """Into the module, unless it holds these very weights already (a round's step
        and its evaluation would otherwise copy a big model in twice)."""
        if weights is not self._holds:
            self._holds = None
            load_weights(self.module, weights, self.setup.model)
            self._holds = weights

    def evaluate(self, weights: Weights) -> RoundEval:
        self.load(weights)
        metric, loss = evaluate(self.setup, self.module)
        self.module.eval()
        return RoundEval(validation_error=float(metric), validation_loss=float(loss))

    def description(self) -> dict[str, Any]:
        return describe(self.setup, self.module)


class SyncState(CoordinatorModel):
    """The coordinator's model and optimizer under sync_sgd. The weights it hands out are
    views of the module's own tensors (sent and scored as they are), and a step changes
    them in place: a big model is held once, not once more as the weights of the round.
    With `in_place` off (an asynchronous run, whose older versions are still being sent
    while a newer one is made) each version is a copy, as `CoordinatorModel` makes."""

    def __init__(self, setup: ModelSetup, config: Mapping[str, Any]) -> None:
        super().__init__(setup, config["seed"], config["batch_size"])
        self.optimizer = _optimizer(config, self.module)
        self.lr = config["lr"]
        self.schedule = setup.settings.schedule(1)  # one step a round
        self.steps = 0  # the optimizer's steps so far: where the schedule stands
        self.in_place = True

    def keep_versions(self) -> None:
        """Hand out copies from now on; the module moves to copies of its tensors, so the
        views handed out so far keep their values when it steps."""
        if self.in_place:
            self.in_place = False
            with torch.no_grad():
                for value in [*self.module.parameters(), *self.module.buffers()]:
                    value.data = value.data.clone()

    def weights(self) -> Weights:
        if not (self.in_place and _viewable(self.module)):
            return super().weights()
        # a new dict each time: callers tell versions apart by identity
        self._holds = {name: value.detach().numpy()
                       for name, value in self.module.state_dict().items()}
        return self._holds

    def parameter_names(self) -> list[str]:
        return modules.parameter_names(self.module)

    def step(self, weights: Weights, average: Weights) -> Weights:
        self.load(weights)
        self._holds = None  # changed below
        params = list(self.module.named_parameters())
        with torch.no_grad():
            for name, param in params:
                param.grad = _gradient(average[GRAD + name], param)
        loop.set_rate(self.optimizer, self.lr, self.schedule, self.steps)
        step_in_blocks(self.optimizer)
        for _, param in params:  # the average's memory is the round's, not the module's
            param.grad = None
        self.steps += 1
        install_buffers(self.module, average)
        return self.weights()

    def step_on_mean(self, weights: Weights, updates: Sequence[Weights],
                     samples: Sequence[int]) -> Weights:
        """`step` on the sample-weighted mean of ``updates`` (`aggregation.weighted_mean`,
        as float32), made a block at a time as the optimizer takes it: the same bits, and
        no whole mean is held (a model's size for a big one)."""
        self.load(weights)
        self._holds = None  # changed below
        gradients = {param: _mean_blocks(aggregation.flat_parts(updates, GRAD + name),
                                         samples, param)
                     for name, param in self.module.named_parameters()}
        loop.set_rate(self.optimizer, self.lr, self.schedule, self.steps)
        step_in_blocks(self.optimizer, gradients, aggregation.BLOCK_ELEMENTS)
        self.steps += 1
        buffers = [BUFFER + name for name in modules.buffer_names(self.module)]
        install_buffers(self.module, aggregation.weighted_mean(
            [{name: u[name] for name in buffers} for u in updates], samples))
        return self.weights()

    def optimizers(self) -> dict[str, tuple[dict[str, torch.Tensor], torch.optim.Optimizer]]:
        return {"model": (dict(self.module.named_parameters()), self.optimizer)}


def _viewable(module: nn.Module) -> bool:
    """Whether numpy can view every tensor of the module's state (on the CPU, of a dtype
    numpy has)."""
    return all(value.device.type == "cpu" and value.dtype in modules.NUMPY_DTYPES
               for value in module.state_dict().values())


def _mean_blocks(parts: list[np.ndarray], samples: Sequence[int],
                 param: torch.Tensor) -> Callable[[slice], torch.Tensor]:
    """Blocks of the parameter's averaged gradient, as `_gradient` would make them."""
    def block(elements: slice) -> torch.Tensor:
        mean = aggregation.mean_of_block(parts, samples, elements).astype(np.float32)
        return torch.from_numpy(mean).to(param.dtype)
    return block


def _gradient(value: np.ndarray, param: torch.Tensor) -> torch.Tensor:
    """An averaged gradient as the parameter's ``.grad``: the array itself when it is a
    writable array of the parameter's dtype (a float32 mean), else a converted copy."""
    array = np.asarray(value)
    if array.dtype != np.float32 or not array.flags.writeable:
        array = np.array(array, dtype=np.float32)
    return torch.from_numpy(array).to(param.dtype)


def _optimizer(config: Mapping[str, Any], module: nn.Module) -> torch.optim.Optimizer:
    name, lr, decay = config["optimizer"], config["lr"], config["weight_decay"]
    if name == "sgd":
        return torch.optim.SGD(module.parameters(), lr=lr, weight_decay=decay)
    kind = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return kind(module.parameters(), lr=lr, betas=BETAS, weight_decay=decay)


# ------------------------------------------------------------------ delta_avg
def local_unit(job: UnitJob, location: Path, examples: Callable[[ModelSetup], np.ndarray],
               local: LocalSteps,
               penalty: Callable[[nn.Module, Weights], torch.Tensor] | None = None
               ) -> UnitOutput | None:
    """Local training on the training part's ``examples(setup)`` (a range, or a client's
    part): the parameters' change, the buffers. ``penalty(module, weights)``: a term added
    to each step's loss, given the module and the round's weights (e.g. FedProx's
    proximal term). None when there are no examples (an empty share of a unit). A
    federated client's unit also measures ``loss_before``: the received weights' loss on
    the same examples, in eval mode, before the first step."""
    setup = job_setup(job, location)
    chosen = examples(setup)
    if len(chosen) == 0:
        return None
    before = None
    with setup.borrowed(job.device) as module:
        load_weights(module, job.weights, job.model)
        if job.unit.client is not None:  # batches of evaluation's size: a forward pass
            # costs a few % of an epoch then (letters: 16 ms against 260 ms)
            before = evaluate(setup, module, Subset(setup.data.train, chosen),
                              device=job.device)[1]
        term = None if penalty is None else functools.partial(penalty, weights=job.weights)
        state, loss = train_locally(setup, module, chosen, local, job.control.step,
                                    job.device, term)
        buffers = buffers_of(module)
    params = modules.parameter_names(module)
    update = {name: state[name] - job.weights[name] for name in params}
    update.update(buffers)
    return UnitOutput(update=update, num_samples=len(chosen), loss=loss, error=math.nan,
                      loss_before=before)


def evaluate_unit(job: UnitJob, location: Path, split_of: Callable[[ModelSetup], Any],
                  batch_size: int) -> UnitOutput:
    """A federated client's evaluation unit: the weights' metric (``error``) and loss on
    ``split_of(setup)``, its validation part; no update (nothing is averaged)."""
    setup = job_setup(job, location)
    part = split_of(setup)
    if len(part) == 0:
        raise ConfigError(f"client {job.unit.client} has no validation example to score")
    with setup.borrowed(job.device) as module:
        load_weights(module, job.weights, job.model)
        metric, loss = evaluate(setup, module, part, batch_size, job.device)
    return UnitOutput(update={}, num_samples=len(part), loss=float(loss), error=float(metric))


def index_range(start: int, stop: int) -> Callable[[ModelSetup], np.ndarray]:
    """The examples ``[start, stop)`` of a setup's training part, once they are inside it."""
    def examples(setup: ModelSetup) -> np.ndarray:
        _check_range(setup, start, stop)
        return np.arange(start, stop)
    return examples


class LocalState(CoordinatorModel):
    """The coordinator's side of delta_avg for a torch model: the server optimizer."""

    def __init__(self, setup: ModelSetup, seed: int, batch_size: int,
                 optimizer: server_optim.ServerOptimizer) -> None:
        super().__init__(setup, seed, batch_size)
        self.optimizer = optimizer
        self.params = modules.parameter_names(self.module)

    def step(self, weights: Weights, combined: Weights) -> Weights:
        """The server optimizer on the parameters' average change; buffers installed."""
        stepped = self.optimizer.step({n: weights[n] for n in self.params},
                                      {n: combined[n] for n in self.params})
        new = {name: value.astype(weights[name].dtype) for name, value in stepped.items()}
        self.load({**weights, **new})
        self._holds = None  # changed below
        install_buffers(self.module, combined)
        return self.weights()


# ------------------------------------------------------------------ both
def built(setup: ModelSetup, seed: int) -> nn.Module:
    """The coordinator's model: drawn from ``seed``, or from `run.init_weights` (a
    safetensors, .pt or .npz file on the coordinator) when the run names one."""
    module = setup.build(seed=seed)
    path = setup.settings.init_weights
    if path:
        # float64, the widest a weight is stored in: a file declaring more is not this model's
        limit = 8 * sum(value.numel() for value in module.state_dict().values())
        try:
            modules.load_arrays(module, load_weights_file(path, limit))
        except ValueError as exc:  # ModelFileError too
            raise ConfigError(f"run.init_weights: {path}: {exc}") from None
    return module
def expected_update(module: nn.Module, weights: Weights, gradients: bool) -> dict[str, tuple]:
    """Names, shapes and dtypes of a node's update: ``grad.<param>`` (sync_sgd) or the
    parameters' own names (delta_avg), and ``buffer.<buffer>`` for the buffers."""
    params = set(modules.parameter_names(module))
    return {(GRAD + name if gradients else name) if name in params else BUFFER + name:
            (value.shape, value.dtype) for name, value in weights.items()}


def staleness_scaled(name: str) -> bool:
    """Changes and gradients are scaled by staleness; buffers are states."""
    return not name.startswith(BUFFER)


def describe(setup: ModelSetup, module: nn.Module) -> dict[str, Any]:
    """The model file's description: enough to rebuild the module with the user's code,
    and to read and score new data as training did (its format and preprocessing, label
    names, loss and metric: training/data/preprocessing.py)."""
    return {"model": setup.model, "model_args": dict(setup.settings.args),
            "fingerprint": modules.fingerprint(module),
            "input_shape": list(setup.data.shape.input_shape),
            "num_classes": setup.data.shape.num_classes,
            "loss": setup.settings.loss, "metric": setup.settings.metric,
            "data": setup.data.record, **_training(setup)}


def _training(setup: ModelSetup) -> dict[str, Any]:
    """The training loop's settings a run changed (run.lr_schedule, clip_norm, precision,
    data.augment, ...), under ``training``; nothing when it changed none, so the
    description of such a run is what it was before they existed."""
    changed = {**setup.settings.loop_changes(),
               **{f"data.{key}": value for key, value in
                  setup.data_settings.loop_changes().items()}}
    return {"training": changed} if changed else {}


def unit_ranges(size: int, units: int) -> list[tuple[int, int]]:
    """``size`` examples cut into ``units`` contiguous ranges as equal as can be."""
    units = max(1, min(units, size))
    bounds = [size * k // units for k in range(units + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


def _check_range(setup: ModelSetup, start: int, stop: int) -> None:
    if not 0 <= start < stop <= len(setup.data.train):
        raise ConfigError(f"index range [{start}, {stop}) is not inside the training part "
                          f"of {len(setup.data.train)} examples (does this node hold "
                          f"another copy of the data set?)")
