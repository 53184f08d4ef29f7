"""The contract between the round engine and an algorithm.

An algorithm holds both halves of the maths: what a compute node computes for one
work unit (`run_unit`) and how the coordinator plans a round and turns the results
into the next weights. It never opens a socket, starts a thread or sleeps: the
round engine owns threads, retries, timeouts and quorum, so every algorithm can be
tested in process.

Hooks with defaults: `aggregator` (how a round's updates are combined: the config's
`aggregation` rule, training/aggregation.py; MD-GAN keeps each unit's update by unit id);
for algorithms that keep state on nodes (MD-GAN): `unit_tensors` (what a unit carries
instead of the global weights), `after_round` (move node sessions, given a
`SessionMoves`), `UnitSpec.preferred_node` (the node tried first), and the class flags
`uses_sessions` (the run drops the nodes' sessions at its end) and `allows_backups`.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from training import aggregation
from training.aggregation import RobustAggregate
from training.cancel import UnitControl

Weights = dict[str, np.ndarray]
MAX_FLOAT_INT = 2**1023  # larger ints do not fit a float


@dataclass(frozen=True)
class UnitSpec:
    """One work unit of a round: a file of the data set, or an index range inside one."""

    unit_id: str
    unit_path: str
    index_start: int | None = None
    index_stop: int | None = None
    # Name ("host:port") of the node to try first, e.g. the one holding the unit's session;
    # the engine falls back to any node when that one is gone or benched.
    preferred_node: str | None = None


@dataclass
class UnitJob:
    """What a node is asked to compute, decoded from the wire."""

    run_id: str
    round: int
    unit: UnitSpec
    model: str
    config: dict[str, Any]
    weights: Weights
    device: str = "cpu"  # where the node computes: "cpu", "cuda", "cuda:1", ...
    # The node's session store (compute_node/sessions.py) for algorithms that keep state
    # on a node between units (Algorithm.uses_sessions); None where there is none.
    sessions: Any = None
    # The unit's cancel flag and batch count: training loops call ``control.step()``
    # before every batch, so a cancelled unit stops at the next batch (training/cancel.py).
    control: UnitControl = field(default_factory=UnitControl)


@dataclass
class UnitOutput:
    """What a node returns for a unit: an update and how much data produced it."""

    update: Weights
    num_samples: int
    loss: float
    error: float


@dataclass
class RoundEval:
    """Metrics of the global model after a round."""

    validation_error: float
    validation_loss: float


TensorSpecs = Mapping[str, tuple[tuple[int, ...], np.dtype]]  # name -> (shape, dtype)


def specs_of(weights: Mapping[str, np.ndarray], prefix: str = "") -> dict[str, tuple]:
    """Each tensor's (shape, dtype), under `prefix` + its name."""
    return {prefix + name: (value.shape, value.dtype) for name, value in weights.items()}


def check_tensors(update: Mapping[str, np.ndarray], expected: TensorSpecs) -> None:
    """ValueError naming the first tensor missing, unexpected, or of another shape or dtype."""
    if set(update) != set(expected):
        missing = sorted(set(expected) - set(update))[:3]
        unexpected = sorted(set(update) - set(expected))[:3]
        raise ValueError(f"update tensors do not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
    for name, (shape, dtype) in expected.items():
        value = update[name]
        if value.shape != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {value.shape}, expected {tuple(shape)}")
        if value.dtype != dtype:
            raise ValueError(f"tensor {name!r} has dtype {value.dtype}, expected {dtype}")


def shown(value: int) -> str:
    """An integer for a one-line message: a huge one abbreviated to its digit count."""
    digits = len(str(abs(value))) if abs(value) < 10**4000 else None
    if digits is not None and digits <= 24:
        return str(value)
    return f"an integer of {digits or 'over 4000'} digits"


def check_sample_count(num_samples: int, holds: int | None) -> None:
    """ValueError unless a result's sample count is possible: at least 1 and at most what
    its unit holds (when known). The count weighs the result in the average, so a node
    claiming more than its unit could otherwise outweigh every other node."""
    upper = "" if holds is None else f"..{holds}"
    if num_samples < 1 or (holds is not None and num_samples > holds):
        raise ValueError(f"num_samples {num_samples} is out of range 1{upper} "
                         f"(the samples its unit holds)")


class ConfigError(ValueError):
    """A configuration value that the algorithm cannot use; the message names the key."""


def check_type(key: str, value: Any, default: Any) -> Any:
    """The value if it has the default's type (an int is accepted for a float); else raise."""
    if isinstance(default, list):
        if not (isinstance(value, list) and value and all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
            raise ConfigError(
                f"config key {key!r} must be a list of positive integers, got {value!r}")
        return list(value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_FLOAT_INT:  # float() would overflow
            raise ConfigError(f"config key {key!r} is out of range, got {shown(value)}")
        return float(value)
    if not isinstance(value, type(default)) or isinstance(value, bool) != isinstance(default,
                                                                                      bool):
        expected = type(default).__name__
        raise ConfigError(f"config key {key!r} must be of type {expected}, got {value!r}")
    return value


def split_aggregation(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An algorithm's config without its `aggregation` settings, and those settings checked
    with defaults filled in (training/aggregation.py); ConfigError names the bad key."""
    rest = {key: value for key, value in config.items() if key != aggregation.SECTION}
    try:
        return rest, aggregation.check_settings(config.get(aggregation.SECTION))
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None


def check_round_size(settings: Mapping[str, Any], updates_per_round: int) -> None:
    """ConfigError if the aggregation rule cannot combine rounds of this many updates."""
    try:
        aggregation.check_round_size(settings, updates_per_round)
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None


class WeightedAverage:
    """Thread-safe weighted average of updates, folded in as results arrive.

    In deterministic mode the updates are kept and summed in unit order at the end,
    so the arrival order cannot change a single bit of the result.
    """

    def __init__(self, deterministic: bool = False) -> None:
        self._lock = threading.Lock()
        self._deterministic = deterministic
        self._sum: Weights = {}
        self._kept: dict[int, tuple[Weights, int]] = {}
        self._total = 0
        self._count = 0

    def add(self, unit_index: int, update: Mapping[str, np.ndarray], num_samples: int) -> None:
        if num_samples <= 0:
            raise ValueError(f"a unit must report a positive sample count, got {num_samples}")
        with self._lock:
            self._count += 1
            self._total += num_samples
            if self._deterministic:
                self._kept[unit_index] = ({k: np.array(v) for k, v in update.items()}, num_samples)
            else:
                self._fold(update, num_samples)

    def _fold(self, update: Mapping[str, np.ndarray], num_samples: int) -> None:
        for name, value in update.items():
            scaled = np.asarray(value, dtype=np.float64) * num_samples
            if name in self._sum:
                self._sum[name] += scaled
            else:
                self._sum[name] = scaled

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def result(self) -> Weights:
        """The weighted mean of everything added; raises if nothing was added."""
        with self._lock:
            if self._deterministic:
                self._sum = {}
                for index in sorted(self._kept):
                    self._fold(*self._kept[index])
            if self._total == 0:
                raise ValueError("no update was added to the average")
            return {name: total / self._total for name, total in self._sum.items()}


class PerUnitUpdates:
    """Every unit's update kept whole, by unit id, instead of one weighted average: for
    algorithms whose units are not interchangeable (MD-GAN: a unit's feedback belongs to
    the generated batch it was computed on). Same interface as WeightedAverage.

    ``result()`` flattens the updates to ``<unit_id>/<name>`` so that `Algorithm.apply`
    keeps its signature; `per_unit` splits them back.
    """

    SEPARATOR = "/"

    def __init__(self, units: Sequence[UnitSpec]) -> None:
        self._ids = [unit.unit_id for unit in units]
        for unit_id in self._ids:
            if self.SEPARATOR in unit_id:
                raise ValueError(f"unit id {unit_id!r} must not hold {self.SEPARATOR!r}")
        self._kept: dict[int, Weights] = {}
        self._lock = threading.Lock()

    def add(self, unit_index: int, update: Mapping[str, np.ndarray], num_samples: int) -> None:
        if num_samples <= 0:
            raise ValueError(f"a unit must report a positive sample count, got {num_samples}")
        with self._lock:
            self._kept[unit_index] = {k: np.array(v) for k, v in update.items()}

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._kept)

    def result(self) -> Weights:
        """Every kept update, in unit order; raises if nothing was added."""
        with self._lock:
            if not self._kept:
                raise ValueError("no update was added")
            return {f"{self._ids[index]}{self.SEPARATOR}{name}": value
                    for index in sorted(self._kept)
                    for name, value in self._kept[index].items()}


def per_unit(flat: Mapping[str, np.ndarray]) -> dict[str, Weights]:
    """Undo `PerUnitUpdates.result`: unit id -> that unit's update."""
    units: dict[str, Weights] = {}
    for key, value in flat.items():
        unit_id, sep, name = key.partition(PerUnitUpdates.SEPARATOR)
        if not sep:
            raise ValueError(f"{key!r} is not a per-unit update name (<unit_id>/<name>)")
        units.setdefault(unit_id, {})[name] = value
    return units


class SessionMoveError(Exception):
    """A node session could not be moved; the message names both ends and the cause."""


@dataclass(frozen=True)
class SessionMoved:
    """What one move carried: payload bytes, and whether it went through the coordinator."""

    bytes: int
    relayed: bool


class SessionMoves(Protocol):
    """What `Algorithm.after_round` may do with node sessions. The coordinator implements
    it over its node connections (coordinator/session_moves.py); tests may use stores."""

    # unit id -> name ("host:port") of the node whose result the round used
    placement: Mapping[str, str]

    def move(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        """Copy ``session`` of node ``source`` into ``target_session`` of node ``target``,
        staged under ``swap_id`` (see compute_node/sessions.py); SessionMoveError if not."""


class Algorithm(ABC):
    """Base class of every training algorithm; see the module docstring."""

    name: ClassVar[str]
    models: ClassVar[tuple[str, ...]]
    # True: nodes keep per-run sessions for this algorithm; the run drops them at its end.
    uses_sessions: ClassVar[bool] = False
    # False: a unit never runs on two nodes at once (no backup attempts), because running
    # it changes state on the node (a session) that a duplicate would fork.
    allows_backups: ClassVar[bool] = True
    # True: nodes compute with torch, so they warm up (import it, build the model) before
    # round 1; False for numpy-only algorithms, whose nodes never load torch.
    uses_torch: ClassVar[bool] = True

    # ------------------------------------------------------------- node half
    @classmethod
    @abstractmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        """Compute one unit on a node, from the job's weights and the node's own data."""

    @classmethod
    @abstractmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a configuration and return it with defaults filled in."""

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """Codecs (training/compression.py) the algorithm can use, by direction. Lossy
        float codecs suit any update; ``topk`` only updates that add up over rounds
        (deltas, gradients), since what it leaves out of one is sent with later ones."""
        return {"up": frozenset({"fp16", "int8", "topk"}), "down": frozenset({"fp16"})}

    @classmethod
    def unit_slot(cls, unit: UnitSpec, config: Mapping[str, Any]) -> str:
        """The unit's place across rounds, which per-unit node state (compression
        residuals) is kept under: the unit id by default."""
        return unit.unit_id

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path) -> None:
        self.model = model
        self.config = self.check_config(model, config)
        self.dataset_dir = dataset_dir

    @abstractmethod
    def initial_weights(self) -> Weights:
        """The weights of round 0."""

    @abstractmethod
    def plan_round(self, round_index: int) -> list[UnitSpec]:
        """The work units of a round."""

    def unit_tensors(self, unit: UnitSpec) -> Weights | None:
        """Tensors sent with this unit instead of the global weights; None (the default)
        sends the global weights with every unit. Called from the engine's threads."""
        return None

    def aggregator(self, units: Sequence[UnitSpec],
                   deterministic: bool) -> WeightedAverage | RobustAggregate | PerUnitUpdates:
        """How the round's results are combined before `apply`: by the config's
        `aggregation` rule, a weighted average folded in as results arrive by default;
        `PerUnitUpdates` keeps each unit's update by unit id."""
        settings = self.config.get(aggregation.SECTION)
        if settings is None or settings["rule"] == "mean":
            return WeightedAverage(deterministic)
        return RobustAggregate(settings)

    def after_round(self, round_index: int, sessions: SessionMoves) -> None:
        """Called after `apply` with where each unit's result came from and a way to move
        node sessions between nodes (e.g. MD-GAN's discriminator swap); nothing by default."""
        return None

    def expected_update(self, weights: Weights) -> TensorSpecs | None:
        """The names, shapes and dtypes a node's update must have, from the weights it
        was sent; None when the algorithm checks its updates otherwise."""
        return None

    def check_update(self, update: Weights, weights: Weights) -> None:
        """Refuse a node's update that cannot be right (ValueError says why); the engine
        then counts a failure and gives the unit to another node. By default: the tensors
        of `expected_update`, with their shapes and dtypes, and every value finite."""
        expected = self.expected_update(weights)
        if expected is not None:
            check_tensors(update, expected)
        for name, value in update.items():
            if not np.all(np.isfinite(value)):
                raise ValueError(f"tensor {name!r} holds NaN or infinite values")

    def unit_samples(self, unit: UnitSpec) -> int | None:
        """How many samples ``unit`` holds: the most a node's result for it may count;
        None when the coordinator cannot know."""
        return None

    def check_samples(self, unit: UnitSpec, num_samples: int) -> None:
        """Refuse a result's sample count outside 1..`unit_samples` (ValueError says why)."""
        check_sample_count(num_samples, self.unit_samples(unit))

    def quorum(self, num_units: int) -> int:
        """How many results end a round (K of N); all of them by default."""
        return num_units

    @abstractmethod
    def apply(self, weights: Weights, average: Weights) -> Weights:
        """The next weights, from the current ones and the round's averaged updates."""

    @abstractmethod
    def evaluate(self, weights: Weights) -> RoundEval:
        """Score the global model on the validation data."""

    @abstractmethod
    def model_description(self) -> dict[str, Any]:
        """What a reader needs, with the weights, to rebuild the model (JSON-serialisable)."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """Coordinator-side optimizer state to checkpoint; none by default."""
        return {}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned (after an .npz round trip), so a resumed
        run continues exactly where the checkpoint left it."""
        if state:
            raise ValueError(f"{self.name} keeps no optimizer state, got {sorted(state)[:3]}")

    def epochs_done(self, round_index: int) -> float | None:
        """Passes over the data set after `round_index` rounds, where that is meaningful."""
        return None

    def sample_images(self, weights: Weights, n: int, seed: int = 0) -> np.ndarray | None:
        """n generated images (n, C, H, W) in [-1, 1] from fixed noise, for generative
        models; None for the others."""
        return None

    def score(self, weights: Weights, n: int) -> dict[str, float]:
        """Offline quality scores of the global model (e.g. IS and FID); none by default."""
        return {}


@dataclass
class Registry:
    """Names to algorithm classes, checked at the boundary with a helpful message.

    Entries are "module:Class" strings imported on first use, so a process only loads
    what its runs need (the letters MLP never imports torch).
    """

    entries: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, target: str) -> None:
        self.entries[name] = target

    def get(self, name: str) -> type[Algorithm]:
        try:
            target = self.entries[name]
        except KeyError:
            known = ", ".join(sorted(self.entries))
            raise ConfigError(f"unknown algorithm {name!r}; known: {known}") from None
        module, _, cls = target.partition(":")
        return getattr(importlib.import_module(module), cls)
