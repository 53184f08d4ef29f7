"""The contract between the round engine and an algorithm.

An algorithm holds both halves of the maths: what a compute node computes for one
work unit (`run_unit`) and how the coordinator plans a round and turns the results
into the next weights. It never opens a socket, starts a thread or sleeps: the
round engine owns threads, retries, timeouts and quorum, so every algorithm can be
tested in process.

The engine hands `aggregate(round, weights, results, failures)` the round's accepted
results (`UnitResult`, each passed through the round's update filters: sample count,
`check_update`, the norm guard) and the units it had to give up. `AveragingAlgorithm`
implements it for algorithms whose updates are interchangeable: the results combined by
the config's `aggregation` rule (training/aggregation.py), then `apply`. MD-GAN
implements it itself: a unit's feedback belongs to the generated batch it was made for.

Hooks with defaults: `check_update` and `check_samples` (refuse a result), and for
algorithms that keep state on nodes (MD-GAN): `unit_tensors` (what a unit carries
instead of the global weights), `after_round` (move node sessions, given a
`SessionMoves`), `UnitSpec.preferred_node` (the node tried first), and the class flags
`uses_sessions` (the run drops the nodes' sessions at its end) and `allows_backups`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from training import aggregation, plugins
from training.cancel import UnitControl
from training.schema import AggregationSettings, defaults

log = logging.getLogger("coordinator.aggregation")

Weights = dict[str, np.ndarray]
TensorSpecs = Mapping[str, tuple[tuple[int, ...], np.dtype]]  # name -> (shape, dtype)
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
    # The request as a relay node forwards it to its group (compute_node/relay.py).
    algorithm: str = ""
    dataset: str = ""
    config_json: str = ""
    model_version: int | None = None
    # (part, parts): compute only that share of the unit (a relay's local rounds send one
    # share to each member); None: the whole unit.
    share: tuple[int, int] | None = None
    # The tensors a result's update must have, as the coordinator checks it (a relay checks
    # its members' results against them); None when the coordinator did not say.
    expected_update: TensorSpecs | None = None


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


def check_update_form(update: Mapping[str, np.ndarray], expected: TensorSpecs | None) -> None:
    """ValueError unless ``update`` has the ``expected`` tensors (when known: names, shapes,
    dtypes) and only finite values: `Algorithm.check_update`'s default, and what a relay
    checks of its members' results (it gets ``expected`` with each unit)."""
    if expected is not None:
        check_tensors(update, expected)
    for name, value in update.items():
        if not np.all(np.isfinite(value)):
            raise ValueError(f"tensor {name!r} holds NaN or infinite values")


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


def section_mapping(section: str, raw: Any, keys: Sequence[str]) -> Mapping[str, Any]:
    """``raw`` as a config section: a mapping of some of ``keys``; ConfigError names the
    section, or the first unknown key as ``section.key``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section} must be a mapping of {', '.join(keys)}, got {raw!r}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(f"unknown key '{section}.{unknown[0]}'; known: {', '.join(keys)}")
    return raw


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


# A torch model's settings in an algorithm's config (training/spec.py): checked by the spec
# and read by training/algorithms/torch_model.py, passed through by `check_config`.
WORKLOAD_SECTIONS = ("model", "data")


def split_aggregation(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An algorithm's own keys (without its `aggregation` settings and a torch model's
    `model` and `data` sections), and the aggregation settings checked with defaults filled
    in (training/aggregation.py); ConfigError names the bad key."""
    shared = (aggregation.SECTION, *WORKLOAD_SECTIONS)
    rest = {key: value for key, value in config.items() if key not in shared}
    try:
        return rest, aggregation.check_settings(config.get(aggregation.SECTION))
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None


def with_workload(checked: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``checked`` with the `model` and `data` sections of ``config``, where it has them."""
    return {**checked, **{key: config[key] for key in WORKLOAD_SECTIONS if key in config}}


def checked_fields(schema: type, config: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``config`` checked against a dataclass's fields: no unknown key, each value of its
    default's type, defaults filled in; ConfigError names the key. The dataclass is then
    built from them, so its own ``__post_init__`` checks run too."""
    if not dataclasses.is_dataclass(schema):
        raise ConfigError(f"{owner}.Config must be a dataclass, got {schema!r}")
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r} for {owner}; known: "
                          f"{', '.join(fields) or 'none'}")
    checked = {}
    for name, spec in fields.items():
        default = _default_of(spec)
        if name not in config:
            if default is dataclasses.MISSING:
                raise ConfigError(f"config key {name!r} of {owner} is required")
            checked[name] = default
        else:
            checked[name] = config[name] if default in (None, dataclasses.MISSING) \
                else check_type(name, config[name], default)
    try:
        schema(**checked)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{owner}: {exc}") from None
    return checked


def _default_of(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def check_round_size(settings: Mapping[str, Any], updates_per_round: int) -> None:
    """ConfigError if the aggregation rule cannot combine rounds of this many updates."""
    try:
        aggregation.check_round_size(settings, updates_per_round)
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class UnitResult:
    """One result of a round that the engine accepted: its unit, the node's update (checked
    by the round's update filters), how many samples produced it, and its training loss."""

    unit: UnitSpec
    update: Weights
    num_samples: int
    loss: float = float("nan")
    node: str | None = None  # name of the node that computed it


@dataclass(frozen=True)
class UnitFailure:
    """A unit of a round that ended without a result (discarded after its failures)."""

    unit: UnitSpec
    reason: str


class SessionMoveError(Exception):
    """A node session could not be moved; the message names both ends and the cause."""


@dataclass(frozen=True)
class SessionMoved:
    """What one move carried: payload bytes, and whether it went through the coordinator."""

    bytes: int
    relayed: bool


class SessionMoves(Protocol):
    """What `Algorithm.after_round` may do with node sessions. The coordinator implements
    it over its node connections (engine/session_moves.py); tests may use stores."""

    # unit id -> name ("host:port") of the node whose result the round used
    placement: Mapping[str, str]

    def move(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        """Copy ``session`` of node ``source`` into ``target_session`` of node ``target``,
        staged under ``swap_id`` (see compute_node/sessions.py); SessionMoveError if not."""


class Algorithm(ABC):
    """Base class of every training algorithm; see the module docstring.

    An author writes `run_unit` (the node half), `initial_weights`, `plan_round`,
    `aggregate` (or `apply`, under `AveragingAlgorithm`) and `evaluate`; the rest has
    defaults. What the algorithm can do is said by the class attributes below, which the
    coordinator reads (nothing elsewhere lists algorithms by name)."""

    name: ClassVar[str]
    models: ClassVar[tuple[str, ...]] = ()  # the models it trains; see `trains`
    # The algorithm's own settings as a dataclass (field names, types and defaults), for
    # the default `check_config`; None: the settings are taken as they come.
    Config: ClassVar[type | None] = None
    # True: it can train in the async and buffered schedules (training/schedule.py), i.e.
    # its results can be applied one by one as they arrive.
    asynchronous: ClassVar[bool] = False
    # True: relays may train it in local rounds (training/hierarchy.py): its update is a
    # change of the model, which a relay can apply to its group's copy.
    local_rounds: ClassVar[bool] = False
    # True: nodes keep per-run sessions for this algorithm; the run drops them at its end.
    uses_sessions: ClassVar[bool] = False
    # False: a unit never runs on two nodes at once (no backup attempts), because running
    # it changes state on the node (a session) that a duplicate would fork.
    allows_backups: ClassVar[bool] = True
    # True: nodes compute with torch, so they warm up (import it, build the model) before
    # round 1; False for numpy-only algorithms, whose nodes never load torch.
    uses_torch: ClassVar[bool] = True
    # True: sync rounds draw their units from passes over the data (`plan_pass`), and the
    # units a K-of-N round did not use come round again in the same pass
    # (engine/pass_queue.py); False: each round is `plan_round`.
    rounds_from_passes: ClassVar[bool] = False
    # True: `run_unit_part` computes a share of a unit, so a node's local workers split
    # one unit between them (compute_node/local_workers.py, training/unit_parts.py).
    splits_units: ClassVar[bool] = False

    # ------------------------------------------------------------- node half
    @classmethod
    @abstractmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        """Compute one unit on a node, from the job's weights and the node's own data."""

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """Share `part` of `parts` of the unit (None: the share holds no sample). The
        shares' sample-weighted mean stands for `run_unit`'s result. Only for algorithms
        that set `splits_units`."""
        raise NotImplementedError(f"{cls.name} does not split units")

    @classmethod
    def writes_weights(cls, model: str) -> bool:
        """Whether a unit of ``model`` may change its job's weights in place. A node gives
        such a unit its own copy of them; any other gets read-only views of the tensors
        received (a model of a gigabyte is not copied once more for every unit)."""
        return True

    @classmethod
    def trains(cls, model: str) -> bool:
        """Whether the algorithm can train the model of this name."""
        return model in cls.models

    @classmethod
    def check_model(cls, model: str) -> None:
        if not cls.trains(model):
            known = ", ".join(cls.models) or "none"
            raise ConfigError(f"algorithm {cls.name!r} cannot train model {model!r} "
                              f"(it trains: {known})")

    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a configuration and return it with defaults filled in. By default the
        fields of the class's `Config` dataclass (each of its type, unknown keys refused),
        or the configuration as it comes when there is none."""
        cls.check_model(model)
        own, settings = split_aggregation(config)
        if cls.Config is not None:
            own = checked_fields(cls.Config, own, cls.name)
        return with_workload({**own, aggregation.SECTION: settings}, config)

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """Codecs (training/compression.py) the algorithm can use, by direction. Lossy
        float codecs suit any update; ``topk`` only updates that add up over rounds
        (deltas, gradients), since what it leaves out of one is sent with later ones."""
        return {"up": frozenset({"fp16", "int8", "topk"}), "down": frozenset({"fp16"})}

    @classmethod
    def add_update(cls, weights: Weights, update: Weights) -> Weights:
        """The weights after a combined update is applied as it is (a relay's local rounds,
        for `local_rounds` algorithms): by default the update's tensors added to the
        weights of the same names."""
        return {name: value + update[name] for name, value in weights.items()}

    @classmethod
    def update_between(cls, before: Weights, after: Weights, like: Weights) -> Weights:
        """The update that takes ``before`` to ``after`` under `add_update` (what a relay
        sends up after its local rounds), of the form of ``like`` (an update of the run):
        by default their difference."""
        return {name: after[name] - before[name] for name in before}

    @classmethod
    def unit_slot(cls, unit: UnitSpec, config: Mapping[str, Any]) -> str:
        """The unit's place across rounds, which per-unit node state (compression
        residuals) is kept under: the unit id by default."""
        return unit.unit_id

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        """``dataset_dir``: the data set's folder under the data root (the data root itself
        for a plug-in data set, which finds its own files); ``dataset``: the data set's name
        as the run gives it (default: the folder's name)."""
        self.model = model
        self.config = self.check_config(model, config)
        self.dataset_dir = dataset_dir
        self.dataset = dataset if dataset is not None else dataset_dir.name

    @abstractmethod
    def initial_weights(self) -> Weights:
        """The weights of round 0."""

    @abstractmethod
    def plan_round(self, round_index: int) -> list[UnitSpec]:
        """The work units of a round."""

    def plan_pass(self, pass_index: int) -> list[UnitSpec]:
        """The units of one pass over the data (from 1), for the asynchronous modes, which
        run passes instead of rounds (training/schedule.py). Unit ids must differ between
        passes. By default a pass is round ``pass_index``'s plan, its ids marked with the
        pass (an algorithm whose round covers the data set once, like delta_avg)."""
        return [replace(unit, unit_id=f"{unit.unit_id}.p{pass_index}")
                for unit in self.plan_round(pass_index)]

    def staleness_scaled(self, name: str) -> bool:
        """Whether a staleness weight scales the update tensor ``name``: True for deltas
        and gradients (the default), False for states averaged as they are."""
        return True

    def units_per_round(self) -> int:
        """How many units a round plans (the run's limits and progress count them before
        round 1); by default, round 1's plan counted (override where planning is costly)."""
        return len(self.plan_round(1))

    def unit_tensors(self, unit: UnitSpec) -> Weights | None:
        """Tensors sent with this unit instead of the global weights; None (the default)
        sends the global weights with every unit. Called from the engine's threads."""
        return None

    def after_round(self, round_index: int, sessions: SessionMoves) -> None:
        """Called after `aggregate` with where each unit's result came from and a way to move
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
        check_update_form(update, self.expected_update(weights))

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
    def aggregate(self, round_index: int, weights: Weights, results: Sequence[UnitResult],
                  failures: Sequence[UnitFailure]) -> Weights:
        """The next weights, from the current ones and the round's accepted results (in
        unit order; every one passed the round's update filters) and failed units."""

    @abstractmethod
    def evaluate(self, weights: Weights) -> RoundEval:
        """Score the global model on the validation data."""

    def model_description(self) -> dict[str, Any]:
        """What a reader needs, with the weights, to rebuild the model (JSON-serialisable)."""
        return {"model": self.model, "algorithm": self.name}

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


class AveragingAlgorithm(Algorithm):
    """An algorithm whose units' updates are interchangeable: the round's results are
    combined into one update by the config's `aggregation` rule (training/aggregation.py;
    the sample-weighted mean by default), which `apply` turns into the next weights."""

    def aggregate(self, round_index: int, weights: Weights, results: Sequence[UnitResult],
                  failures: Sequence[UnitFailure]) -> Weights:
        return self.apply(weights, self.combine(results))

    def combine(self, results: Sequence[UnitResult]) -> Weights:
        """The round's results as one update, by the configured rule."""
        settings = self.config.get(aggregation.SECTION) or defaults(AggregationSettings)
        return combine(settings, results)

    @abstractmethod
    def apply(self, weights: Weights, combined: Weights) -> Weights:
        """The next weights, from the current ones and the round's combined update."""


def combine(settings: Mapping[str, Any], results: Sequence[UnitResult]) -> Weights:
    """``results`` combined by the rule of ``settings`` (as `aggregation.check_settings`
    returns them); a robust rule's time is logged, since it costs more than the mean."""
    if not results:
        raise ValueError("no result to aggregate")
    started = time.perf_counter()
    combined = aggregation.aggregate(settings, [r.update for r in results],
                                     [r.num_samples for r in results])
    if settings["rule"] != "mean":
        log.info("aggregated %d updates by %s in %.2f ms", len(results), settings["rule"],
                 (time.perf_counter() - started) * 1000)
    return combined


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
        """The class of a built-in name, or of a plug-in ``module:Class`` (imported only from
        a module this process allows, training/plugins.py)."""
        if plugins.is_plugin_name(name) and name not in self.entries:
            found = plugins.resolve(name, "algorithm")
            if not (isinstance(found, type) and issubclass(found, Algorithm)):
                raise plugins.PluginError(f"algorithm {name} is not a subclass of "
                                          "thrift_trainer.Algorithm")
            return found
        try:
            target = self.entries[name]
        except KeyError:
            known = ", ".join(sorted(self.entries))
            raise ConfigError(f"unknown algorithm {name!r}; known: {known}, or a plug-in "
                              f"module:Class") from None
        module, _, cls = target.partition(":")
        return getattr(importlib.import_module(module), cls)
