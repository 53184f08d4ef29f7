"""The maths of a torch model on a node and on the coordinator, for any ``nn.Module``.

`ModelSetup` joins what a run names (the model, its settings, the data set and its
loss and metric). The node halves of the algorithms call `mean_gradients` (sync_sgd: the
mean gradient over a unit) and `train_locally` (delta_avg: local epochs or steps from the
given weights); the coordinator calls `evaluate` after every round.

BatchNorm and other buffers are states, not parameters: a node returns the buffers its
module holds after its pass over the unit under ``buffer.<name>``, the coordinator
averages them by sample counts like the rest and installs the average (integer buffers,
BatchNorm's batch count, rounded), as the built-in GANs do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from thrift_trainer.training.cancel import no_step
from thrift_trainer.training.data.batches import PLAIN, Reader
from thrift_trainer.training.data.datasets import LoadedData, Split, load_data
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.lr_schedule import global_step
from thrift_trainer.training.models import loop, modules, objectives
from thrift_trainer.training.models.names import BUFFER, GRAD
from thrift_trainer.training.models.pool import ModulePool
from thrift_trainer.training.models.settings import ModelSettings
from thrift_trainer.training.plugins import PluginError

Weights = dict[str, np.ndarray]
LOCAL_OPTIMIZERS = ("gd", "sgd", "adam", "adamw")


@dataclass(frozen=True)
class ModelSetup:
    """A run's torch model with its data, loss and metric, as one process reads them."""

    model: str
    settings: ModelSettings
    data: LoadedData
    loss: objectives.Objective
    metric: objectives.Metric
    # how training batches are read on a node: augmented, transformed, read ahead
    reader: Reader = PLAIN
    data_settings: DataSettings = DataSettings()

    @classmethod
    def load(cls, model: str, settings: ModelSettings, dataset: str, location: Path,
             data_settings: DataSettings) -> ModelSetup:
        """``location``: the data set's folder (or the data root, for a plug-in data set)."""
        data = load_data(dataset, location, data_settings)
        classes = data.shape.num_classes is not None
        loss = objectives.loss_function(settings, classes)
        return cls(model, settings, data, loss, objectives.metric_function(settings, classes,
                                                                           loss),
                   Reader(data_settings, data.shape), data_settings)

    def training_batches(self, order: Iterable[np.ndarray], seed: int, device: str
                         ) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """(indices, inputs, targets) of the training part's batches in ``order``, shaped
        by the run's data settings (augmentation seeded by ``seed``), on ``device``."""
        for indices, inputs, targets in self.reader.batches(self.data.train.take, order,
                                                            seed):
            yield indices, *_on(device, inputs, targets)

    @property
    def loss_name(self) -> str:
        return self.settings.loss

    def build(self, seed: int | None = None) -> nn.Module:
        return modules.build(self.model, self.settings.args, self.data.shape, seed)

    def fingerprint(self) -> str:
        return modules.fingerprint_of(self.model, self.settings.args, self.data.shape)

    @contextlib.contextmanager
    def borrowed(self, device: str = "cpu") -> Iterator[nn.Module]:
        """A built module of this model from the process's pool (building one costs more
        than loading weights into it; every weight is overwritten before use)."""
        key = (self.model, repr(sorted(self.settings.args.items())), self.data.shape, device)
        with _POOL.borrow(key, lambda: self.build().to(device)) as module:
            yield module


_POOL: ModulePool[nn.Module] = ModulePool()


# ------------------------------------------------------------------ node maths
def batches(start: int, stop: int, batch_size: int) -> Iterator[np.ndarray]:
    for first in range(start, stop, batch_size):
        yield np.arange(first, min(first + batch_size, stop))


def mean_gradients(setup: ModelSetup, module: nn.Module, start: int, stop: int,
                   batch_size: int, step: Callable[[], None] = no_step,
                   device: str = "cpu", seed: int = 0) -> tuple[Weights, float]:
    """The mean gradient of the loss over examples ``[start, stop)`` of the training part
    (micro-batches weighted by their share) as ``grad.<name>``, the buffers after the pass
    as ``buffer.<name>``, and the mean loss of the micro-batches. (Nodes compute no metric:
    it would cost a second forward pass; the coordinator scores the model every round.)"""
    return mean_gradients_over(setup, module, np.arange(start, stop), batch_size, step,
                               device, seed)


def mean_gradients_over(setup: ModelSetup, module: nn.Module, examples: np.ndarray,
                        batch_size: int, step: Callable[[], None] = no_step,
                        device: str = "cpu", seed: int = 0) -> tuple[Weights, float]:
    """`mean_gradients` over the training part's ``examples`` (any indices, in their
    order: a federated client's batch), in micro-batches of ``batch_size``; ``seed``: the
    unit's, for the data's augmentation."""
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    size, loss_sum = len(examples), 0.0
    precision = setup.settings.precision
    # fp16 gradients are taken of a scaled loss (so small ones do not vanish), unscaled below
    scale = loop.FP16_GRADIENT_SCALE if precision == "fp16" else 1.0
    sums = _GradientSums(params, scale)
    order = (examples[first:first + batch_size] for first in range(0, size, batch_size))
    try:
        for indices, inputs, targets in setup.training_batches(order, seed, device):
            step()
            share = len(indices) / size
            with loop.autocast(precision, device):
                loss = objectives.checked_loss(setup.loss(module, inputs, targets),
                                               _named(setup))
            sums.add(loss * share if scale == 1.0 else loss * share * scale)
            loss_sum += float(loss.detach()) * share
    finally:
        totals = sums.take()  # a cancelled unit leaves no gradient in the pooled module
    # the unit's mean gradient is clipped, before the coordinator averages the units: each
    # unit's pull on the model is bounded, as per-client clipping does
    loop.clip_tensors(totals, setup.settings.clip_norm)
    names = [name for name, p in module.named_parameters() if p.requires_grad]
    # the sums are this call's own tensors: their memory becomes the update, uncopied
    update = {GRAD + name: total.detach().cpu().numpy()
              for name, total in zip(names, totals, strict=True)}
    update.update(buffers_of(module))
    return update, loss_sum


class _GradientSums:
    """The micro-batches' gradients summed per parameter. Unscaled, they are summed by
    autograd into each parameter's ``.grad``: the first one's gradient becomes the sum
    and the others are added into it, one copy of the model (taking each gradient apart
    and adding it to a sum of zeros holds two); the same numbers. Scaled (fp16), each is
    unscaled before it is added, into sums of their own."""

    def __init__(self, params: list[torch.Tensor], scale: float) -> None:
        self.params, self.scale = params, scale
        self.totals = None if scale == 1.0 else [torch.zeros_like(p) for p in params]
        for param in params:  # a sum starts empty
            param.grad = None

    def add(self, scaled: torch.Tensor) -> None:
        if self.totals is None:
            scaled.backward()
            return
        for total, grad in zip(self.totals, torch.autograd.grad(scaled, self.params,
                                                                allow_unused=True),
                               strict=True):
            if grad is not None:
                total += grad.float() / self.scale

    def take(self) -> list[torch.Tensor]:
        """The sums, which the parameters no longer hold."""
        if self.totals is not None:
            return self.totals
        totals = [p.grad.detach() if p.grad is not None else torch.zeros_like(p)
                  for p in self.params]
        for param in self.params:
            param.grad = None
        return totals


@dataclass(frozen=True)
class LocalSteps:
    """How a node trains locally (delta_avg): an optimizer over its unit's examples."""

    optimizer: str  # gd (full batch) | sgd | adam | adamw
    lr: float
    batch_size: int
    epochs: int  # passes over the unit, when steps is 0
    steps: int = 0  # optimizer steps per unit (DiLoCo's inner steps); 0: epochs
    weight_decay: float = 0.0
    seed: int = 0  # shuffles the examples; depends on the unit, not on the node
    round: int = 1  # the unit's round: where run.lr_schedule stands (across rounds)


Penalty = Callable[[nn.Module], torch.Tensor]  # a term added to every local step's loss


def train_locally(setup: ModelSetup, module: nn.Module, examples: np.ndarray,
                  local: LocalSteps, step: Callable[[], None] = no_step,
                  device: str = "cpu", penalty: Penalty | None = None
                  ) -> tuple[Weights, float]:
    """Train ``module`` (holding the round's weights) on the training part's ``examples``
    (indices: a unit's range, or a client's part); returns its new state (parameters and
    buffers, by name) and the mean training loss (without ``penalty``, which an algorithm
    may add to each step's loss, e.g. FedProx's)."""
    module.train()
    optimizer = _optimizer(local, module)
    rng = np.random.default_rng(local.seed)
    batch = len(examples) if local.optimizer == "gd" else local.batch_size
    settings = setup.settings
    steps = local_step_count(len(examples), batch, local)
    schedule = settings.schedule(steps)
    scaler = loop.scaler(settings.precision, device)
    params = [p for p in module.parameters() if p.requires_grad]
    loss_sum, count = 0.0, 0
    order = _local_batches(examples, batch, local, rng)
    for done, (indices, inputs, targets) in enumerate(setup.training_batches(
            order, local.seed, device)):
        step()
        optimizer.zero_grad(set_to_none=True)
        loop.set_rate(optimizer, local.lr, schedule, global_step(local.round, steps, done))
        with loop.autocast(settings.precision, device):
            loss = objectives.checked_loss(setup.loss(module, inputs, targets), _named(setup))
            total = loss + penalty(module) if penalty is not None else loss
        _backward_and_step(optimizer, total, params, settings.clip_norm, scaler)
        loss_sum += float(loss.detach()) * len(indices)
        count += len(indices)
    return modules.state_arrays(module), loss_sum / max(count, 1)


def _backward_and_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor,
                       params: list[torch.Tensor], clip_norm: float,
                       scaler: torch.amp.GradScaler | None) -> None:
    """One optimizer step, its gradients clipped (run.clip_norm) and, in fp16, scaled."""
    if scaler is None:
        loss.backward()
        loop.clip(params, clip_norm)
        optimizer.step()
        return
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # clipping bounds the true gradients, not the scaled ones
    loop.clip(params, clip_norm)
    scaler.step(optimizer)
    scaler.update()


def local_step_count(size: int, batch: int, local: LocalSteps) -> int:
    """Optimizer steps a unit of ``size`` examples takes: its `steps`, or its epochs'
    batches (the schedule's steps per round)."""
    return local.steps or local.epochs * -(-size // max(batch, 1))


def _local_batches(examples: np.ndarray, batch: int, local: LocalSteps,
                   rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffled batches over the examples: ``epochs`` passes, or ``steps`` batches."""
    done = 0
    while True:
        order = examples[rng.permutation(len(examples))] if local.optimizer != "gd" else \
            examples
        for first in range(0, len(order), batch):
            yield order[first:first + batch]
            done += 1
            if local.steps and done >= local.steps:
                return
        if not local.steps and done >= local.epochs * -(-len(examples) // batch):
            return


def _optimizer(local: LocalSteps, module: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in module.parameters() if p.requires_grad]
    if local.optimizer in ("gd", "sgd"):
        return torch.optim.SGD(params, lr=local.lr, weight_decay=local.weight_decay)
    if local.optimizer == "adam":
        return torch.optim.Adam(params, lr=local.lr, weight_decay=local.weight_decay)
    return torch.optim.AdamW(params, lr=local.lr, weight_decay=local.weight_decay)


def buffers_of(module: nn.Module) -> Weights:
    state = module.state_dict()
    return {BUFFER + name: _array(state[name]) for name in modules.buffer_names(module)}


# ------------------------------------------------------------------ coordinator
@torch.no_grad()
def evaluate(setup: ModelSetup, module: nn.Module, split: Split | None = None,
             batch_size: int = 256, device: str = "cpu") -> tuple[float, float]:
    """(metric, loss) of ``module`` (on ``device``) over the validation part (or ``split``),
    example-weighted, in eval mode."""
    return score(module, split if split is not None else setup.data.validation,
                 setup.metric, setup.loss, batch_size, device)


@torch.no_grad()
def score(module: nn.Module, part: Split, metric: objectives.Metric,
          loss: objectives.Objective, batch_size: int = 256,
          device: str = "cpu") -> tuple[float, float]:
    """(metric, loss) of ``module`` (on ``device``) over ``part``, example-weighted, in eval
    mode: how the coordinator scores every round, and `client.py evaluate` a model file."""
    if len(part) == 0:
        return float("nan"), float("nan")
    module.eval()
    metric_sum = loss_sum = 0.0
    for indices in batches(0, len(part), batch_size):
        batch_metric, batch_loss = objectives.metric_and_loss(
            metric, loss, module, *_on(device, *part.take(indices)))
        metric_sum += batch_metric * len(indices)
        loss_sum += batch_loss * len(indices)
    return metric_sum / len(part), loss_sum / len(part)


def install_buffers(module: nn.Module, average: Mapping[str, np.ndarray]) -> None:
    """Averaged ``buffer.<name>`` values into the module; integer buffers are rounded."""
    state = module.state_dict()
    for name in modules.buffer_names(module):
        value = np.asarray(average[BUFFER + name])
        if not state[name].is_floating_point():
            value = np.rint(value)
        modules.copy_into(state[name], value)


def check_model_runs(setup: ModelSetup, module: nn.Module, batch_size: int) -> None:
    """One loss and metric on a few training examples, before a run starts: a forward that
    raises, a loss that is not a finite number or a metric that fails is refused here, with
    its name, instead of on every node (PluginError)."""
    indices = np.arange(min(batch_size, len(setup.data.train), 8))
    inputs, targets = setup.data.train.take(indices)
    try:
        module.train()
        objectives.checked_loss(setup.loss(module, inputs, targets), _named(setup))
        with torch.no_grad():
            module.eval()
            float(setup.metric(module, inputs, targets))
    except objectives.LossError as exc:
        raise PluginError(f"model {setup.model}: {exc}") from None
    except Exception as exc:
        raise PluginError(f"model {setup.model} fails on its data: {type(exc).__name__}: "
                          f"{exc}") from None


def _named(setup: ModelSetup) -> str:
    return setup.settings.loss if setup.settings.loss != "auto" else "of the model"


def _on(device: str, inputs: torch.Tensor, targets: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    if device == "cpu":
        return inputs, targets
    return inputs.to(device), targets.to(device)


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A C-ordered numpy copy (a view would let a later step change a result in flight)."""
    return np.array(tensor.detach().cpu().numpy(), order="C", copy=True)
