"""`client.py evaluate` and `predict` for torch models: the built-in ``mlp_classifier`` or
a plug-in (``module:attribute``, allowed with ``--plugins`` as on the coordinator and nodes).

The model file's description says how to rebuild the module (its name, ``model_args``,
input shape and classes) and how training read and preprocessed its data (``data``,
training/data/preprocessing.py): new data is read the same way, so `evaluate` on the
validation data scores what the coordinator scored, with the run's metric and loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from thrift_trainer.training import plugins
from thrift_trainer.training.data import preprocessing
from thrift_trainer.training.data.datasets import TensorSplit
from thrift_trainer.training.models import modules, objectives
from thrift_trainer.training.models.module_training import batches, score
from thrift_trainer.training.models.settings import DataShape, ModelSettings
from thrift_trainer.training.plugins import PluginError

BATCH = 256  # examples per forward pass, as the coordinator scores


class TorchScoringError(ValueError):
    """A torch model file or data the commands cannot use; one line that says why."""


def evaluate(model_path: str, weights: dict[str, np.ndarray], description: dict[str, Any],
             data_path: str) -> dict[str, Any]:
    """The run's metric (its "validation error") and loss of the model on labelled data."""
    module = build_module(model_path, weights, description)
    inputs, targets = _data(preprocessing.labelled, description, data_path)
    classes = description.get("num_classes") is not None
    if not classes:
        targets = targets.to(torch.float32)
    settings = _settings(model_path, description)
    try:
        loss = objectives.loss_function(settings, classes)
        metric = objectives.metric_function(settings, classes, loss)
        value, mean_loss = score(module, TensorSplit(inputs, targets), metric, loss, BATCH)
    except PluginError as exc:
        raise TorchScoringError(str(exc)) from None
    except (RuntimeError, ValueError, IndexError) as exc:
        raise TorchScoringError(f"{model_path} cannot score {data_path}: "
                                f"{type(exc).__name__}: {exc}") from None
    return {"metric": _metric_name(settings, classes), "error": float(value),
            "loss": float(mean_loss), "rows": len(targets)}


def predict(model_path: str, weights: dict[str, np.ndarray], description: dict[str, Any],
            data_path: str) -> list[str]:
    """One line per example: its predicted label (the label's text when the file records
    label names), or its predicted values; an image's line starts with its path."""
    module = build_module(model_path, weights, description)
    inputs, names = _data(preprocessing.unlabelled, description, data_path)
    try:
        outputs = _outputs(module, inputs)
    except (RuntimeError, ValueError, IndexError) as exc:
        raise TorchScoringError(f"{model_path} cannot run on {data_path}: "
                                f"{type(exc).__name__}: {exc}") from None
    shown = _shown(outputs, description)
    return shown if names is None else [f"{name}\t{text}" for name, text in zip(names, shown,
                                                                                  strict=True)]


def build_module(model_path: str, weights: dict[str, np.ndarray],
            description: dict[str, Any]) -> nn.Module:
    """The module the file describes, holding its weights, in eval mode."""
    why = preprocessing.problem(description.get("data"))
    if why is not None:
        raise TorchScoringError(f"{model_path} lacks {why}; it was saved by an older "
                                "trainer: train it again to evaluate or predict with it")
    name = str(description["model"])
    module_name = name.partition(plugins.SEPARATOR)[0]
    if plugins.is_plugin_name(name) and not any(
            module_name == m or module_name.startswith(m + ".")
            for m in plugins.allowed_modules()):
        raise TorchScoringError(f"{model_path} holds plug-in model {name}: allow its module "
                                f"with --plugins {module_name.split('.')[0]} (found in the "
                                "current folder or --plugin-dir)")
    shape = DataShape(tuple(description["input_shape"]), description.get("num_classes"))
    try:
        module = modules.build(name, description.get("model_args") or {}, shape)
        modules.load_arrays(module, weights)
    except PluginError as exc:
        raise TorchScoringError(str(exc)) from None
    except ValueError as exc:
        raise TorchScoringError(f"{model_path} is damaged: {exc}") from None
    return module.eval()


def _settings(model_path: str, description: dict[str, Any]) -> ModelSettings:
    try:
        return ModelSettings.from_mapping({"loss": description.get("loss", "auto"),
                                           "metric": description.get("metric", "auto")})
    except ValueError as exc:
        raise TorchScoringError(f"{model_path} is damaged: {exc}") from None


def _metric_name(settings: ModelSettings, classes: bool) -> str:
    if settings.metric != "auto":
        return settings.metric
    return "error_rate" if classes else "mse"


def _data(read: Any, description: dict[str, Any], data_path: str) -> tuple[torch.Tensor, Any]:
    try:
        inputs, other = read(description["data"], data_path)
    except preprocessing.PreprocessingError as exc:
        raise TorchScoringError(str(exc)) from None
    if len(inputs) == 0:
        raise TorchScoringError(f"{data_path} holds no examples")
    expected = tuple(description["input_shape"])
    if tuple(inputs.shape[1:]) != expected:
        raise TorchScoringError(f"{data_path}: examples of shape {tuple(inputs.shape[1:])}, "
                                f"the model takes {expected}")
    return inputs, other


@torch.no_grad()
def _outputs(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return torch.cat([module(inputs[torch.from_numpy(indices)])
                      for indices in batches(0, len(inputs), BATCH)])


def _shown(outputs: torch.Tensor, description: dict[str, Any]) -> list[str]:
    """Each example's prediction as text: class scores (last dimension) become the class,
    named when the file records label names; several per example (a sequence) are joined
    by spaces."""
    rows = len(outputs)
    if description.get("num_classes") is None:
        values = outputs.reshape(rows, -1).tolist()
        return [" ".join(f"{v:.6g}" for v in row) for row in values]
    names = (description.get("data") or {}).get("label_names")
    chosen = outputs.reshape(rows, -1, outputs.shape[-1]).argmax(dim=-1).tolist()
    return [" ".join(names[c] if names and c < len(names) else str(c) for c in row)
            for row in chosen]
