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

The types an algorithm deals in (`UnitSpec`, `UnitJob`, `UnitResult`, ...) live in
training/units.py; reading its settings, in training/algorithms/config_checks.py.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from thrift_trainer.training import aggregation
from thrift_trainer.training.algorithms.config_checks import (
    ConfigError,
    checked_fields,
    split_aggregation,
    with_workload,
)
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import (
    RoundEval,
    SessionMoves,
    TensorSpecs,
    UnitFailure,
    UnitJob,
    UnitOutput,
    UnitResult,
    UnitSpec,
    Weights,
)
from thrift_trainer.training.update_checks import check_sample_count, check_update_form

log = logging.getLogger("coordinator.aggregation")


class Algorithm(ABC):
    """Base class of every training algorithm; see the module docstring.

    An author writes `run_unit` (the node half), `initial_weights`, `plan_round`,
    `aggregate` (or `apply`, under `AveragingAlgorithm`) and `evaluate`; the rest has
    defaults. What the algorithm can do is said by the class attributes below, which the
    coordinator reads (nothing elsewhere lists algorithms by name)."""

    name: ClassVar[str]
    models: ClassVar[tuple[str, ...]] = ()  # the models it trains; see `trains`
    # The algorithm's own settings as a dataclass (field names, types and defaults): the
    # built-ins' are training/schema.py's sections, which their `check_config` reads with
    # `checked_settings`; a plug-in's is checked by the default `check_config`. None: the
    # settings are taken as they come.
    Config: ClassVar[type | None] = None
    # True: it can train in the async and buffered schedules (training/schedule.py), i.e.
    # its results can be applied one by one as they arrive.
    asynchronous: ClassVar[bool] = False
    # True: relays may train it in local rounds (training/hierarchy.py): its update is a
    # change of the model, which a relay can apply to its group's copy.
    local_rounds: ClassVar[bool] = False
    # True: it makes a run with clients differentially private at the client level when
    # the run has a `privacy` section (training/privacy/, docs/privacy.md): its `aggregate`
    # clips and noises the clients' updates and it tells the accounting how rounds sample.
    private: ClassVar[bool] = False
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
    # True: a run may give it federated clients (training/clients/: the `clients` section);
    # `takes_clients` says for which models.
    clients: ClassVar[bool] = False

    def take_clients(self, sizes: dict[str, int],
                     labels: dict[str, dict[int, int] | None]) -> PartitionRecord:
        """Take node-resident clients as their nodes announced them (only algorithms whose
        `takes_clients` allows a run clients are asked)."""
        raise NotImplementedError(f"{self.name} has no federated clients")

    @property
    def partition(self) -> PartitionRecord | None:
        """The run's partition into federated clients, for the run folder; None without."""
        return None

    def client_units(self) -> list[UnitSpec] | None:
        """One unit per federated client with examples, for an asynchronous run to draw
        from (engine/client_draws.py); None: the run has no clients."""
        return None

    def clients_at_once(self, capacity: int) -> int:
        """Federated clients an asynchronous run keeps training at once, given the units
        its nodes take at once: all of those by default."""
        return capacity

    def evaluation_units(self, round_index: int, rounds: int) -> list[UnitSpec]:
        """Federated evaluation: the units (kind "evaluate") that score the global model
        after ``round_index`` of ``rounds`` on clients' validation parts; none by
        default."""
        return []

    @property
    def scores_accuracy(self) -> bool:
        """Whether the run's metric is an error rate, so that 1 - metric is an accuracy."""
        return False

    @classmethod
    def takes_clients(cls, model: str) -> str | None:
        """Why this algorithm cannot train ``model`` on federated clients, or None."""
        if not cls.clients:
            return (f"{cls.name} does not train on federated clients (delta_avg, sync_sgd "
                    f"and fl_gan do)")
        return None

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
    def unit_config(cls, job: UnitJob) -> Mapping[str, Any]:
        """The job's config checked with defaults filled in, as `run_unit` reads it: the
        one its node checked once for the run (never to be changed), else checked here."""
        if job.checked_config is not None:
            return job.checked_config
        return cls.check_config(job.model, job.config)

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

    def keep_each_version(self) -> None:
        """Called before an asynchronous run: every version of the weights `aggregate`
        returns must stay as it is (an older one may still be on its way to a node while
        a newer one is made). An algorithm that steps its model in place and hands out
        views of it makes copies from then on; nothing to do by default."""
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

    # True: `apply` takes the combined update as float32, so the mean of float32 updates
    # is written out as float32 (the same bits, half the memory of a float64 mean).
    applies_float32: ClassVar[bool] = False

    def combine(self, results: Sequence[UnitResult]) -> Weights:
        """The round's results as one update, by the configured rule."""
        settings = self.config.get(aggregation.SECTION) or defaults(AggregationSettings)
        return combine(settings, results, self.applies_float32)

    @abstractmethod
    def apply(self, weights: Weights, combined: Weights) -> Weights:
        """The next weights, from the current ones and the round's combined update."""


def combine(settings: Mapping[str, Any], results: Sequence[UnitResult],
            narrow: bool = False) -> Weights:
    """``results`` combined by the rule of ``settings`` (as `aggregation.check_settings`
    returns them; ``narrow`` as `aggregation.aggregate` takes it); a robust rule's time
    is logged, since it costs more than the mean."""
    if not results:
        raise ValueError("no result to aggregate")
    started = time.perf_counter()
    combined = aggregation.aggregate(settings, [r.update for r in results],
                                     [r.num_samples for r in results], narrow)
    if settings["rule"] != "mean":
        log.info("aggregated %d updates by %s in %.2f ms", len(results), settings["rule"],
                 (time.perf_counter() - started) * 1000)
    return combined
