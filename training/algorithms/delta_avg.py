"""Delta averaging (federated averaging) of the letters MLP: the assignment's algorithm.

Node half: train `epochs` local epochs on one shard from the given weights and return
final - initial. Coordinator half: one unit per `train_*` file, a weighted average of
the round's deltas, applied through a server optimizer ("avg" adds it, as in the
assignment), then the validation error on `validate_*`.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training import server_optim
from training.aggregation import SECTION as AGGREGATION
from training.algorithms.base import (
    AveragingAlgorithm,
    ConfigError,
    RoundEval,
    TensorSpecs,
    UnitJob,
    UnitOutput,
    UnitSpec,
    Weights,
    check_round_size,
    check_type,
    specs_of,
    split_aggregation,
)
from training.data.letters import load_letters
from training.models import mlp
from training.unit_parts import part_bounds

# Every key the algorithm understands, with its default and type.
DEFAULTS: dict[str, Any] = {
    "epochs": 15,
    "eta": 0.0001,
    "hidden": [20],
    "compat": False,
    "scale_features": False,
    "local_optimizer": "gd",
    "batch_size": 32,
    "server_optimizer": "avg",
    "server_lr": 1.0,
    "server_momentum": 0.9,
    "seed": 1,
}
LOCAL_OPTIMIZERS = ("gd", "sgd", "adam")


class DeltaAveraging(AveragingAlgorithm):
    name = "delta_avg"
    models = ("mlp",)
    uses_torch = False  # numpy on the nodes
    splits_units = True

    # ------------------------------------------------------------- node half
    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        if model not in cls.models:
            raise ConfigError(f"algorithm {cls.name!r} trains models {cls.models}, not {model!r}")
        config, aggregation = split_aggregation(config)
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise ConfigError(
                f"unknown config key {unknown[0]!r} for {cls.name}; known: {', '.join(DEFAULTS)}"
            )
        checked = {k: check_type(k, config.get(k, v), v) for k, v in DEFAULTS.items()}
        if checked["epochs"] < 1:
            raise ConfigError("config key 'epochs' must be at least 1")
        _check_optimizer_ranges(checked)
        if checked["local_optimizer"] not in LOCAL_OPTIMIZERS:
            raise ConfigError(
                f"config key 'local_optimizer' must be one of {LOCAL_OPTIMIZERS}, "
                f"got {checked['local_optimizer']!r}"
            )
        if checked["batch_size"] < 1:
            raise ConfigError("config key 'batch_size' must be at least 1")
        if checked["compat"] and (len(checked["hidden"]) != 1 or checked["scale_features"]):
            raise ConfigError("'compat' reproduces the reference MLP: one hidden layer, no scaling")
        try:
            server_optim.make_server_optimizer(checked["server_optimizer"],
                                               **_server_kwargs(checked))
        except ValueError as exc:
            raise ConfigError(f"config key 'server_optimizer': {exc}") from None
        return {**checked, AGGREGATION: aggregation}

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        return cls._train_rows(job, *load_letters(dataset_dir / job.unit.unit_path))

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """Local training on a share of the unit file's rows; the node averages the
        shares' deltas (local averaging, not one sequential training of the file)."""
        features, labels = load_letters(dataset_dir / job.unit.unit_path)
        lo, hi = part_bounds(len(labels), part, parts)
        return cls._train_rows(job, features[lo:hi], labels[lo:hi]) if hi > lo else None

    @classmethod
    def _train_rows(cls, job: UnitJob, features: Any, labels: Any) -> UnitOutput:
        config = cls.check_config(job.model, job.config)
        spec = _spec(config)
        _check_weights(job.weights, mlp.init_params(spec, seed=0))
        local = mlp.LocalTraining(
            epochs=config["epochs"],
            eta=config["eta"],
            optimizer=config["local_optimizer"],
            batch_size=config["batch_size"],
            seed=_unit_seed(config["seed"], job.round, job.unit.unit_id),
        )
        trained, stats = mlp.train_local(job.weights, features, labels, spec, local,
                                         job.control.step)
        delta = {name: trained[name] - job.weights[name] for name in job.weights}
        return UnitOutput(
            update=delta, num_samples=len(labels), loss=float(stats.loss), error=float(stats.error)
        )

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path) -> None:
        super().__init__(model, config, dataset_dir)
        self.spec = _spec(self.config)
        self.units = _unit_files(dataset_dir)
        check_round_size(self.config[AGGREGATION], len(self.units))  # every unit is averaged
        # Rows of each unit file: the most samples a node's result for it may count.
        self.unit_rows = {name: len(load_letters(dataset_dir / name)[1]) for name in self.units}
        self.validation = _validation_data(dataset_dir)
        self.optimizer = server_optim.make_server_optimizer(
            self.config["server_optimizer"], **_server_kwargs(self.config)
        )

    def initial_weights(self) -> Weights:
        return mlp.init_params(self.spec, seed=self.config["seed"])

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        return [UnitSpec(unit_id=name, unit_path=name) for name in self.units]

    def unit_samples(self, unit: UnitSpec) -> int | None:
        return self.unit_rows.get(unit.unit_path)

    def expected_update(self, weights: Weights) -> TensorSpecs:
        """A delta has exactly the weights' tensors, shapes and dtypes."""
        return specs_of(weights)

    def apply(self, weights: Weights, combined: Weights) -> Weights:
        return self.optimizer.step(weights, combined)

    def evaluate(self, weights: Weights) -> RoundEval:
        error, loss = mlp.evaluate(weights, *self.validation, self.spec)
        return RoundEval(validation_error=float(error), validation_loss=float(loss))

    def model_description(self) -> dict[str, Any]:
        return {"model": "mlp", "spec": self.spec.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def _check_optimizer_ranges(config: Mapping[str, Any]) -> None:
    """Learning rates finite and positive, momentum in [0, 1), a seed numpy accepts."""
    for key in ("eta", "server_lr"):
        if not (math.isfinite(config[key]) and config[key] > 0):
            raise ConfigError(f"config key {key!r} must be positive, got {config[key]}")
    if not 0.0 <= config["server_momentum"] < 1.0:
        raise ConfigError(f"config key 'server_momentum' must be in [0, 1), "
                          f"got {config['server_momentum']}")
    if not 0 <= config["seed"] < 2**31:
        raise ConfigError(f"config key 'seed' must be in [0, 2**31), got {config['seed']}")


def _spec(config: Mapping[str, Any]) -> mlp.MLPSpec:
    return mlp.MLPSpec(
        hidden=tuple(config["hidden"]),
        compat=config["compat"],
        scale_features=config["scale_features"],
    )


def _server_kwargs(config: Mapping[str, Any]) -> dict[str, float]:
    name = config["server_optimizer"]
    if name == "momentum":
        return {"lr": config["server_lr"], "beta": config["server_momentum"]}
    if name == "adam":
        return {"lr": config["server_lr"]}
    return {}


def _unit_seed(seed: int, round_index: int, unit_id: str) -> int:
    """A shuffling seed that depends on the unit, not on the node that runs it."""
    return (seed * 1_000_003 + round_index * 7919 + zlib.crc32(unit_id.encode())) % (2**31)


def _check_weights(weights: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    if set(weights) != set(expected):
        raise ConfigError(
            f"weights {sorted(weights)} do not match the model's tensors {sorted(expected)}"
        )
    for name, value in expected.items():
        if weights[name].shape != value.shape:
            raise ConfigError(
                f"tensor {name!r} has shape {weights[name].shape}, the model needs {value.shape}"
            )


def _unit_files(dataset_dir: Path) -> list[str]:
    """The `train_*` files, in natural order (train_letters2 before train_letters10)."""
    files = [p.name for p in dataset_dir.glob("train_*") if p.is_file()]
    if not files:
        raise ConfigError(f"no train_* files in {dataset_dir}: each one is a work unit")
    return sorted(files, key=_natural_key)


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _validation_data(dataset_dir: Path) -> tuple[Any, Any]:
    files = sorted(p for p in dataset_dir.glob("validate_*") if p.is_file())
    if not files:
        raise ConfigError(f"no validate_* file in {dataset_dir}: the validation set is needed")
    return load_letters(files[0])
