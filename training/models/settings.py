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

The training loop (training/lr_schedule.py, training/models/module_training.py):

* ``lr_schedule``: ``constant`` | ``warmup_cosine`` | ``linear`` | ``step``, of the local
  optimizer (delta_avg, across rounds) or the coordinator's optimizer (sync_sgd, over its
  steps); ``warmup_steps`` of linear warm-up; ``lr_rounds``: the rounds it spans (the
  client sets run.rounds); ``lr_end``: the factor it ends at; ``lr_step_every`` and
  ``lr_step_gamma``: the ``step`` kind's decay.
* ``server_lr_schedule`` and ``server_warmup_rounds``: delta_avg's server optimizer, over
  rounds.
* ``clip_norm``: gradients clipped to this global norm (0: off).
* ``precision``: ``fp32`` | ``bf16`` (autocast) | ``fp16`` (autocast and a loss scaler,
  CUDA only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.lr_schedule import KINDS, Schedule
from thrift_trainer.training.settings_section import SettingsSection

SECTION = "model"
LOSSES = ("auto", "cross_entropy", "mse")
METRICS = ("auto", "error_rate", "mse", "loss")
PRECISIONS = ("fp32", "bf16", "fp16")
# the keys of the training loop: plain values, checked by their defaults' types
LOOP_KEYS = ("lr_schedule", "warmup_steps", "lr_rounds", "lr_end", "lr_step_every",
             "lr_step_gamma", "server_lr_schedule", "server_warmup_rounds", "clip_norm",
             "precision")


class ModelSettingsError(ValueError):
    """A ``run.model_*`` setting that cannot be used; the message names the key."""


@dataclass(frozen=True)
class ModelSettings(SettingsSection):
    args: dict[str, Any] = field(default_factory=dict)
    loss: str = "auto"
    metric: str = "auto"
    init_weights: str = ""
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    lr_rounds: int = 0
    lr_end: float = 0.0
    lr_step_every: int = 0
    lr_step_gamma: float = 0.1
    server_lr_schedule: str = "constant"
    server_warmup_rounds: int = 0
    clip_norm: float = 0.0
    precision: str = "fp32"

    @classmethod
    def from_mapping(cls, raw: Any) -> ModelSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ModelSettingsError(f"{SECTION} must be a mapping, got {raw!r}")
        unknown = sorted(set(raw) - {"args", "loss", "metric", "init_weights", *LOOP_KEYS})
        if unknown:
            raise ModelSettingsError(f"unknown key 'run.model_{unknown[0]}'")
        args = raw.get("args", {})
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            raise ModelSettingsError(f"run.model_args must be a mapping of argument names, "
                                     f"got {args!r}")
        loop = {key: checked_value(f"run.{key}", raw[key], getattr(cls, key),
                                   ModelSettingsError) for key in LOOP_KEYS if key in raw}
        settings = cls(dict(args), raw.get("loss", "auto"), raw.get("metric", "auto"),
                       raw.get("init_weights", ""), **loop)
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
        self._check_loop()

    def _check_loop(self) -> None:
        for key in ("lr_schedule", "server_lr_schedule"):
            if getattr(self, key) not in KINDS:
                raise ModelSettingsError(f"run.{key} must be one of {', '.join(KINDS)}, "
                                         f"got {getattr(self, key)!r}")
        if self.precision not in PRECISIONS:
            raise ModelSettingsError(f"run.precision must be one of {', '.join(PRECISIONS)}, "
                                     f"got {self.precision!r}")
        for key in ("warmup_steps", "lr_rounds", "lr_step_every", "server_warmup_rounds"):
            if getattr(self, key) < 0:
                raise ModelSettingsError(f"run.{key} must be 0 or more, "
                                         f"got {getattr(self, key)}")
        if not 0.0 <= self.lr_end <= 1.0:
            raise ModelSettingsError(f"run.lr_end must be in [0, 1], got {self.lr_end}")
        if not 0.0 < self.lr_step_gamma <= 1.0:
            raise ModelSettingsError(f"run.lr_step_gamma must be in (0, 1], "
                                     f"got {self.lr_step_gamma}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm >= 0.0):
            raise ModelSettingsError(f"run.clip_norm must be 0 (off) or a positive number, "
                                     f"got {self.clip_norm}")
        if self.needs_rounds and self.lr_rounds < 1:
            raise ModelSettingsError("run.lr_rounds must be at least 1 with a decaying "
                                     "schedule (the client sets it to run.rounds)")

    @property
    def needs_rounds(self) -> bool:
        """Whether a schedule decays, and so needs to know the rounds it spans."""
        return self.lr_schedule != "constant" or self.server_lr_schedule != "constant"

    def schedule(self, steps_per_round: int) -> Schedule:
        """The optimizer's schedule (`lr_schedule`), ``steps_per_round`` steps a round."""
        return Schedule(self.lr_schedule, max(1, self.lr_rounds) * steps_per_round,
                        self.warmup_steps, self.lr_end, self.lr_step_every,
                        self.lr_step_gamma)

    def server_schedule(self) -> Schedule:
        """delta_avg's server optimizer's schedule, one step a round."""
        return Schedule(self.server_lr_schedule, max(1, self.lr_rounds),
                        self.server_warmup_rounds, self.lr_end, 0, self.lr_step_gamma)

    def loop_changes(self) -> dict[str, Any]:
        """The training-loop keys a run changes from their defaults (for the model file)."""
        return {key: value for key, value in self.changed().items() if key in LOOP_KEYS}


@dataclass(frozen=True)
class DataShape:
    """What a model may need to know of its data: one example's input shape and, for
    classification, the number of classes (None for regression)."""

    input_shape: tuple[int, ...]
    num_classes: int | None

    @property
    def in_features(self) -> int:
        return math.prod(self.input_shape)
