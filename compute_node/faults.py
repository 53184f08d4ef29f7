"""Fault injection for tests and drills, as a wrapper around the node's handler.

`FaultyNode` serves what `ComputeNodeHandler` serves and breaks it on purpose: crash the
process (`--crash-after-units`), hang a unit until it is cancelled (`--hang-after-units`),
slow every unit down (`--slowdown F`: its maths takes F times as long, like a slower
machine), or spoil what a unit returns (`--corrupt-updates`, from `--corrupt-after-units`
on). The
spoilt results are those a broken node might send (NaN values, a wrong shape, a huge
norm, an impossible sample count) or a Byzantine one (an update sign-flipped and scaled
by 10, scaled by 100, or replaced by noise of its norm), for robust aggregation. The
production handler holds no fault branch: it only lets the wrapper run a unit's maths.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from pathlib import Path
from time import monotonic
from typing import Any

import numpy as np

from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.cancel import UnitCancelled
from thrift_trainer.training.units import UnitJob, UnitOutput, Weights
from thrift_trainer.wire.generated import ttypes

log = logging.getLogger("compute_node")

HANG_SECONDS = 3600.0  # --hang-after-units: how long a unit hangs unless cancelled
CRASH_EXIT_CODE = 17
UPDATE_CORRUPTIONS = ("nan", "shape", "huge")
BYZANTINE = {"signflip": -10.0, "scaled": 100.0}  # the update times this factor
RANDOM = "random"  # Gaussian noise with the update's norm
# Sample counts weigh a result in the average: none at all, or enough to outweigh any node.
SAMPLE_CORRUPTIONS = {"zero-samples": 0, "huge-samples": 10**15}
CORRUPTIONS = (*UPDATE_CORRUPTIONS, *SAMPLE_CORRUPTIONS, *BYZANTINE, RANDOM)


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Which faults a node injects, and from which unit on (units count from 1)."""

    crash_after_units: int | None = None
    hang_after_units: int | None = None
    corrupt: str | None = None  # one of CORRUPTIONS
    corrupt_after_units: int = 0
    seed: int | None = None  # of the `random` corruption's noise
    slowdown: float = 1.0  # a unit takes this many times its maths' time

    @property
    def any(self) -> bool:
        return (self.crash_after_units is not None or self.hang_after_units is not None
                or self.corrupt is not None or self.slowdown > 1.0)


def with_faults(handler: ComputeNodeHandler, plan: FaultPlan) -> Any:
    """The handler to serve: `handler` itself, or wrapped when `plan` injects a fault."""
    return FaultyNode(handler, plan) if plan.any else handler


class FaultyNode:
    """Serves `handler`'s calls, injecting the faults of `plan`. Every unit asked of the
    node counts (accepted or not), as a node that breaks after N requests would."""

    def __init__(self, handler: ComputeNodeHandler, plan: FaultPlan) -> None:
        self._handler = handler
        self._plan = plan
        self._units_seen = 0
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(plan.seed)
        self._inner = handler.unit_runner  # the maths the faults spoil (a relay's group...)
        handler.unit_runner = self._run_unit

    def __getattr__(self, name: str) -> Any:  # every other call: the handler's own
        return getattr(self._handler, name)

    @property
    def node_id(self) -> str:
        return self._handler.node_id

    @node_id.setter
    def node_id(self, value: str) -> None:
        self._handler.node_id = value

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        with self._lock:
            self._units_seen += 1
            seen = self._units_seen
        if _after(self._plan.crash_after_units, seen):
            log.error("crashing on purpose (--crash-after-units %d)",
                      self._plan.crash_after_units)
            os._exit(CRASH_EXIT_CODE)  # abruptly, mid-call, as a killed process would
        return self._handler.train_with_weights(request)

    def _run_unit(self, algorithm: type[Algorithm], job: UnitJob, data_dir: Path) -> UnitOutput:
        """The unit's maths, hung or spoilt as planned (called under the compute lock)."""
        with self._lock:
            seen = self._units_seen
        if _after(self._plan.hang_after_units, seen):
            job.control.cancelled.wait(HANG_SECONDS)  # silent, yet answering pings
            raise UnitCancelled("hung on purpose (--hang-after-units) until cancelled")
        began = monotonic()
        output = self._inner(algorithm, job, data_dir)
        if self._plan.slowdown > 1.0:
            _stretch(job, (self._plan.slowdown - 1.0) * (monotonic() - began))
        if self._plan.corrupt and seen > self._plan.corrupt_after_units:
            output = corrupt_output(output, self._plan.corrupt, self._rng)
        return output


def _stretch(job: UnitJob, seconds: float) -> None:
    """Hold the unit `seconds` more, as a slower machine would (idle, so the node's CPU
    stays free for the others on this one); a cancel ends the wait and the unit."""
    if job.control.cancelled.wait(seconds):
        raise UnitCancelled("cancelled while slowed down (--slowdown)")


def _after(limit: int | None, seen: int) -> bool:
    return limit is not None and seen > limit


def corrupt_output(output: UnitOutput, mode: str,
                   rng: np.random.Generator | None = None) -> UnitOutput:
    """`output` with its update or its sample count spoiled the way `mode` says."""
    if mode in SAMPLE_CORRUPTIONS:
        return dataclasses.replace(output, num_samples=SAMPLE_CORRUPTIONS[mode])
    return dataclasses.replace(output, update=corrupt_update(output.update, mode, rng))


def corrupt_update(update: Weights, mode: str,
                   rng: np.random.Generator | None = None) -> Weights:
    """`update` spoiled the way `mode` says: NaN values, a tensor one row short, finite
    values a million times too large, or a Byzantine update (see the module docstring)."""
    if mode == "nan":
        return {name: np.full_like(value, np.nan) for name, value in update.items()}
    if mode == "shape":
        return {name: value[:-1] if value.ndim and len(value) > 1 else value
                for name, value in update.items()}
    if mode == "huge":
        return {name: value * 1e6 for name, value in update.items()}
    if mode in BYZANTINE:
        return {name: (value * BYZANTINE[mode]).astype(value.dtype)
                for name, value in update.items()}
    if mode == RANDOM:
        return random_update(update, rng or np.random.default_rng())
    raise ValueError(f"unknown corruption {mode!r}; one of {', '.join(CORRUPTIONS)}")


def random_update(update: Weights, rng: np.random.Generator) -> Weights:
    """Gaussian noise of the same shapes and dtypes, scaled to the update's L2 norm."""
    noise = {name: rng.normal(size=value.shape) for name, value in update.items()}
    norm = math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in update.values()))
    noise_norm = math.sqrt(sum(float(np.sum(v * v)) for v in noise.values())) or 1.0
    return {name: (noise[name] * (norm / noise_norm)).astype(value.dtype)
            for name, value in update.items()}
