"""Checks of a train request before any run exists: its fields, and the coordinator's limits.

A request that asks for unbounded work (10^6 local epochs, a billion rounds, hidden layers
of 10^9 units) would hold the nodes long after its run is cancelled, so that any client
could wedge the cluster. The limits are the coordinator's (`--max-epochs` and the others);
every refusal is the IDL's InvalidRequest naming the field, e.g.
``rounds: 5000000000 is out of range 1..1000000 (this coordinator's --max-rounds)``.

Config keys are checked by name, after the algorithm's own `check_config` has typed them:
the names are shared by every algorithm (config.yaml is their schema).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thrift_trainer.coordinator.records import InvalidRun, RunRequest
from thrift_trainer.training.algorithms.config_checks import shown
from thrift_trainer.training.models.mlp import MLPSpec
from thrift_trainer.training.models.names import NAME_LIMIT  # of an algorithm's name too
from thrift_trainer.wire import security

DATASET_LIMIT = 255  # characters of a data set name (a folder under the data root)
EPOCH_KEYS = ("epochs", "local_epochs", "disc_steps")  # passes or steps a node makes per unit
UNIT_KEYS = ("units_per_iteration", "workers")  # work units sent out per round
HIDDEN_KEY = "hidden"
BYTES_PER_WEIGHT = 8  # float64, the widest dtype weights travel in
MIB = 2**20
MESSAGE_ROOM = MIB  # a result's fields besides its tensors: names, shapes, numbers


@dataclass(frozen=True)
class RequestLimits:
    """The most a single request may ask for; generous enough for every documented recipe."""

    max_rounds: int = 1_000_000
    max_epochs: int = 1_000
    max_hidden: int = 8_192
    max_units: int = 1_000
    max_model_mb: float = 256.0


def invalid(field: str, problem: str) -> InvalidRun:
    return InvalidRun(f"{field}: {problem}")


def check_range(field: str, value: int, high: int, flag: str) -> None:
    """InvalidRequest unless 1 <= value <= high (a limit set by `flag`)."""
    if isinstance(value, bool) or not isinstance(value, int):  # e.g. a field left out
        raise invalid(field, f"an integer is required, got {value!r}")
    if not 1 <= value <= high:
        raise invalid(field, f"{shown(value)} is out of range 1..{high} "
                             f"(this coordinator's {flag})")


def check_fields(request: RunRequest, limits: RequestLimits) -> None:
    """The request's own fields: names short enough to echo and to use as paths, and rounds."""
    for field, value, limit in (("algorithm", request.algorithm, NAME_LIMIT),
                                ("model", request.model, NAME_LIMIT),
                                ("dataset", request.dataset, DATASET_LIMIT)):
        if not isinstance(value, str) or not value:
            raise invalid(field, "a name is required")
        if len(value) > limit:
            raise invalid(field, f"a name of {len(value)} characters, longer than {limit}")
    check_range("rounds", request.rounds, limits.max_rounds, "--max-rounds")


def check_config(config: Mapping[str, Any], limits: RequestLimits) -> None:
    """The work a typed algorithm config asks for: epochs, units, hidden sizes, model size."""
    for key in EPOCH_KEYS:
        if key in config:
            check_range(f"config key {key!r}", config[key], limits.max_epochs, "--max-epochs")
    for key in UNIT_KEYS:
        if key in config:
            check_range(f"config key {key!r}", config[key], limits.max_units, "--max-units")
    hidden = config.get(HIDDEN_KEY)
    if hidden:
        for width in hidden:
            check_range(f"config key {HIDDEN_KEY!r}", width, limits.max_hidden, "--max-hidden")
        check_model_bytes(mlp_bytes(hidden), limits, f"config key {HIDDEN_KEY!r}")


def check_units(count: int, limits: RequestLimits) -> None:
    """Units a round sends out, however the algorithm counts them (e.g. files of a data set)."""
    if count > limits.max_units:
        raise invalid("units", f"{count} per round, more than this coordinator's "
                               f"--max-units {limits.max_units}")


def check_model_bytes(size: int, limits: RequestLimits, field: str = "model") -> None:
    """The model within --max-model-mb, and its updates within the largest message this
    coordinator takes (--max-message-mb): else no result could ever come back."""
    if size > limits.max_model_mb * MIB:
        raise invalid(field, f"a model of {size / MIB:.1f} MiB, more than this coordinator's "
                             f"--max-model-mb {limits.max_model_mb:g}")
    taken = security.current().messages.max_message_bytes
    if size + MESSAGE_ROOM > taken:
        raise invalid(field, f"a model of {size / MIB:.1f} MiB, whose updates would not fit "
                             f"the {taken / MIB:g} MiB this coordinator takes in one message "
                             f"(--max-message-mb {taken / MIB:g})")


def mlp_bytes(hidden: list[int]) -> int:
    """Bytes of the MLP's weights with these hidden sizes, counted without allocating them."""
    shapes = MLPSpec(hidden=tuple(hidden)).layer_shapes()
    return sum(math.prod(shape) for shape in shapes.values()) * BYTES_PER_WEIGHT
