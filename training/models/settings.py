"""How a torch model is built, trained and scored: the ``run.model_*`` settings, checked.

They travel in a request's config under ``model`` (training/spec.py), only when one of them
differs from its default, so requests of the built-in models stay what they were.

* ``args``: keyword arguments of the model's class or factory (`run.model_args`).
* ``loss``: ``auto`` (cross-entropy for integer targets, mean squared error for real ones)
  | ``cross_entropy`` | ``mse`` | a plug-in ``module:function(model, inputs, targets)``
  returning a batch's mean loss as a 0-d tensor: the training step (`run.loss`).
* ``metric``: ``auto`` (error rate for integer targets, mean squared error otherwise) |
  ``error_rate`` | ``mse`` | ``loss`` | a plug-in ``module:function(model, inputs, targets)``
  returning a batch's mean as a number, lower is better (`run.metric`): the run's
  "validation error".
* ``init_weights``: a safetensors, .pt or .npz file of the coordinator's to start from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thrift_trainer.training.settings_section import SettingsSection

SECTION = "model"
LOSSES = ("auto", "cross_entropy", "mse")
METRICS = ("auto", "error_rate", "mse", "loss")


class ModelSettingsError(ValueError):
    """A ``run.model_*`` setting that cannot be used; the message names the key."""


@dataclass(frozen=True)
class ModelSettings(SettingsSection):
    args: dict[str, Any] = field(default_factory=dict)
    loss: str = "auto"
    metric: str = "auto"
    init_weights: str = ""

    @classmethod
    def from_mapping(cls, raw: Any) -> ModelSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ModelSettingsError(f"{SECTION} must be a mapping, got {raw!r}")
        unknown = sorted(set(raw) - {"args", "loss", "metric", "init_weights"})
        if unknown:
            raise ModelSettingsError(f"unknown key 'run.model_{unknown[0]}'")
        args = raw.get("args", {})
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            raise ModelSettingsError(f"run.model_args must be a mapping of argument names, "
                                     f"got {args!r}")
        settings = cls(dict(args), raw.get("loss", "auto"), raw.get("metric", "auto"),
                       raw.get("init_weights", ""))
        settings._check()
        return settings

    def _check(self) -> None:
        for key, built_in in (("loss", LOSSES), ("metric", METRICS)):
            value = getattr(self, key)
            if not isinstance(value, str) or not (value in built_in or ":" in value):
                raise ModelSettingsError(f"run.{key} must be one of {', '.join(built_in)} or "
                                         f"a plug-in module:function, got {value!r}")
        if not isinstance(self.init_weights, str):
            raise ModelSettingsError(f"run.init_weights must be a file path, "
                                     f"got {self.init_weights!r}")


@dataclass(frozen=True)
class DataShape:
    """What a model may need to know of its data: one example's input shape and, for
    classification, the number of classes (None for regression)."""

    input_shape: tuple[int, ...]
    num_classes: int | None

    @property
    def in_features(self) -> int:
        return math.prod(self.input_shape)
