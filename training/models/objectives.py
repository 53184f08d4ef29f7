"""What a torch model is trained on and scored by: its loss (the training step) and metric.

Both take ``(model, inputs, targets)`` and run the forward pass themselves, so a plug-in's
loss can be any training step (a language model's shifted targets, a contrastive pair).
The defaults follow the targets: integer targets are classes (cross-entropy; the metric is
the error rate), real ones are regression (mean squared error for both). A model whose
output has more dimensions than its targets plus one (a sequence of class scores) is
scored per position: scores (..., C) against targets (...).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from thrift_trainer.training import plugins
from thrift_trainer.training.models.settings import ModelSettings
from thrift_trainer.training.plugins import PluginError

Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
Metric = Callable[[nn.Module, torch.Tensor, torch.Tensor], float]


class LossError(ValueError):
    """A loss that cannot train the model (NaN, infinite, not a scalar); names the loss."""


def cross_entropy(model: nn.Module, inputs: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
    return _cross_entropy_of(model(inputs), targets)


def mse(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return _mse_of(model(inputs), targets)


def error_rate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    return _error_rate_of(model(inputs), targets)


def mse_metric(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    return float(mse(model, inputs, targets))


def _cross_entropy_of(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1))


def _mse_of(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs, targets.reshape(outputs.shape).to(outputs.dtype))


def _error_rate_of(scores: torch.Tensor, targets: torch.Tensor) -> float:
    predicted = scores.reshape(-1, scores.shape[-1]).argmax(dim=1)
    return float((predicted != targets.reshape(-1)).float().mean())


_LOSSES: dict[str, Objective] = {"cross_entropy": cross_entropy, "mse": mse}
_METRICS: dict[str, Metric] = {"error_rate": error_rate, "mse": mse_metric}
# Built-in (metric, loss) pairs scored from one forward pass: (metric, loss) of the outputs.
_FROM_OUTPUTS: dict[tuple[Metric, Objective], Callable[[torch.Tensor, torch.Tensor],
                                                       tuple[float, float]]] = {
    (error_rate, cross_entropy): lambda scores, targets: (
        _error_rate_of(scores, targets), float(_cross_entropy_of(scores, targets))),
    (mse_metric, mse): lambda outputs, targets: (float(_mse_of(outputs, targets)),) * 2,
}


def loss_function(settings: ModelSettings, classes: bool) -> Objective:
    """The run's loss; ``classes``: the data set's targets are class numbers."""
    name = settings.loss if settings.loss != "auto" else \
        ("cross_entropy" if classes else "mse")
    return _LOSSES[name] if name in _LOSSES else _plugin(name, "loss")


def metric_function(settings: ModelSettings, classes: bool, loss: Objective) -> Metric:
    """The run's metric (its "validation error"); ``loss``: the loss, for metric "loss"."""
    name = settings.metric if settings.metric != "auto" else \
        ("error_rate" if classes else "mse")
    if name == "loss":
        return lambda model, inputs, targets: float(loss(model, inputs, targets))
    return _METRICS[name] if name in _METRICS else _plugin(name, "metric")


def metric_and_loss(metric: Metric, loss: Objective, model: nn.Module, inputs: torch.Tensor,
                    targets: torch.Tensor) -> tuple[float, float]:
    """A batch's metric and loss: a built-in pair from one forward pass, else each its own."""
    from_outputs = _FROM_OUTPUTS.get((metric, loss))
    if from_outputs is not None:
        return from_outputs(model(inputs), targets)
    return float(metric(model, inputs, targets)), float(loss(model, inputs, targets))


def checked_loss(value: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` if it can train a model: a finite 0-d tensor; else LossError."""
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise LossError(f"loss {name} must return a 0-d tensor, got "
                        f"{getattr(value, 'shape', type(value).__name__)}")
    number = float(value.detach())
    if not math.isfinite(number):
        raise LossError(f"loss {name} is {number}: the model cannot be trained on it "
                        "(a learning rate too high, or a bug in the model or loss)")
    return value


def _plugin(name: str, kind: str) -> Callable:
    function = plugins.resolve(name, kind)
    if not callable(function):
        raise PluginError(f"{kind} {name} is not a function (model, inputs, targets)")
    return function
