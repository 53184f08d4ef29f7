"""The run configuration's schema: one frozen dataclass per section, the one home of every
default.

config.yaml documents these sections key by key and a unit test keeps it equal to them
(keys, order, defaults and their types), so adding a key is one field here plus its line
there. The client merges a recipe over `file_defaults` (training/run_config.py); the
algorithms, the aggregation rules and the run's outputs fill in what a request leaves out
from `defaults`. The sections every run shares and a spec parses (compression, schedule,
hierarchy, data, model) keep their dataclasses next to their checks; training/run_config.py
lists all sections in the order of config.yaml.

A field whose metadata is `INHERIT` is written as null in config.yaml and takes the `run`
key of the same name (delta_avg.seed: run.seed); one whose metadata is `NULL_IS_DEFAULT`
is null there and left to the algorithm (md_gan.k: "log2"); one made with `by_model` is null
there and takes the default of the run's kind of model (delta_avg.eta: 0.0001 for the
letters MLP, 0.001 for a torch model). This module imports no
algorithm and no torch, so the client, the coordinator and the nodes all share it.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from thrift_trainer.training.config_types import shown
from thrift_trainer.training.models.settings import ModelSettings

MAX_ROUNDS = 2**31 - 1  # rounds travel as a Thrift i32
INHERIT = {"null": "run"}  # null in config.yaml: the run key of the same name
NULL_IS_DEFAULT = {"null": "default"}  # null in config.yaml: the algorithm's default


def by_model(module_default: Any) -> dict[str, Any]:
    """A key whose default depends on the model (null in config.yaml): the field's default
    for the letters MLP, ``module_default`` for a torch model."""
    return {"null": "model", "module_default": module_default}


@dataclass(frozen=True)
class RunSection:
    """What to train, on what, for how long (config.yaml's `run`)."""

    algorithm: str = "delta_avg"
    model: str = "mlp"
    model_args: dict[str, Any] = field(default_factory=dict)
    loss: str = ModelSettings.loss
    metric: str = ModelSettings.metric
    init_weights: str = ModelSettings.init_weights
    lr_schedule: str = ModelSettings.lr_schedule
    warmup_steps: int = ModelSettings.warmup_steps
    lr_rounds: int = ModelSettings.lr_rounds
    lr_end: float = ModelSettings.lr_end
    lr_step_every: int = ModelSettings.lr_step_every
    lr_step_gamma: float = ModelSettings.lr_step_gamma
    server_lr_schedule: str = ModelSettings.server_lr_schedule
    server_warmup_rounds: int = ModelSettings.server_warmup_rounds
    clip_norm: float = ModelSettings.clip_norm
    precision: str = ModelSettings.precision
    dataset: str = "letters"
    algorithm_args: dict[str, Any] = field(default_factory=dict)
    rounds: int = 5
    seed: int = 1
    deterministic: bool = False


def rounds_problem(rounds: Any, most: int = MAX_ROUNDS,
                   limit: str = "rounds travel as a 32-bit field") -> str | None:
    """Why ``rounds`` cannot be a run's number of rounds (an integer in 1..``most``, whose
    ``limit`` the message names), or None: the one check of rounds, for the client's
    config and arguments, the coordinator's requests and the run store."""
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        return f"an integer is required, got {rounds!r}"
    if not 1 <= rounds <= most:
        return f"{shown(rounds)} is out of range 1..{most} ({limit})"
    return None


@dataclass(frozen=True)
class DeltaAvgSettings:
    """delta_avg's keys (training/algorithms/delta_avg.py)."""

    # The letters MLP's values are the assignment's; a torch model left to the defaults gets
    # the recipe a user would pick: one epoch of Adam at 0.001 over minibatches per round.
    epochs: int = field(default=15, metadata=by_model(1))
    eta: float = field(default=0.0001, metadata=by_model(0.001))
    hidden: list[int] = field(default_factory=lambda: [20])
    compat: bool = False
    scale_features: bool = False
    local_optimizer: str = field(default="gd", metadata=by_model("adam"))
    batch_size: int = 32
    server_optimizer: str = "avg"
    server_lr: float = 1.0
    server_momentum: float = 0.9
    seed: int = field(default=1, metadata=INHERIT)
    units: int = 10
    local_steps: int = 0
    weight_decay: float = 0.0


# sync_sgd's keys depend on the model: a GAN's, the letters MLP's or another torch model's.
GAN, MLP, MODULE = "gan", "mlp", "module"
_ANY = {"models": (GAN, MLP, MODULE)}


def _for(*models: str, **more: Any) -> dict[str, Any]:
    return {"models": models, **more}


@dataclass(frozen=True)
class SyncSgdSettings:
    """sync_sgd's keys (training/algorithms/sync_sgd.py). One config file serves every
    model, so each key names the models it applies to; the others drop it."""

    images_per_work_unit: int = field(default=320, metadata=_ANY)
    num_workunits_per_update: int = field(default=3, metadata=_ANY)
    units_per_iteration: int = field(default=4, metadata=_ANY)
    batch_size: int = field(default=32, metadata=_ANY)
    seed: int = field(default=1, metadata={**_ANY, **INHERIT})
    lr_g: float = field(default=2e-4, metadata=_for(GAN))
    lr_d: float = field(default=2e-4, metadata=_for(GAN))
    beta1: float = field(default=0.5, metadata=_for(GAN))
    beta2: float = field(default=0.999, metadata=_for(GAN))
    batchnorm: bool = field(default=True, metadata=_for(GAN))
    # Measured on letters: validation error 0.97 -> 0.43 after 20 rounds of 3 x 320; other
    # torch models start from Adam's usual 0.001.
    lr: float = field(default=0.01, metadata=_for(MLP, MODULE, module_default=0.001))
    optimizer: str = field(default="adam", metadata=_for(MODULE))
    weight_decay: float = field(default=0.0, metadata=_for(MODULE))
    hidden: list[int] = field(default_factory=lambda: [128, 128], metadata=_for(MLP))
    scale_features: bool = field(default=True, metadata=_for(MLP))


@dataclass(frozen=True)
class MdGanSettings:
    """md_gan's keys (training/algorithms/md_gan.py)."""

    workers: int = 4
    batch_size: int = 64
    k: int | str = field(default="log2", metadata=NULL_IS_DEFAULT)
    disc_steps: int = 1
    swap_every_epochs: float = 1.0
    swap: bool = True
    swap_optimizer: bool = True
    lr: float = 2e-4
    beta1: float = 0.5
    beta2: float = 0.999
    seed: int = field(default=1, metadata=INHERIT)
    batchnorm: bool = True


@dataclass(frozen=True)
class FlGanSettings:
    """fl_gan's keys (training/algorithms/fl_gan.py)."""

    workers: int = 4
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 2e-4
    beta1: float = 0.5
    beta2: float = 0.999
    seed: int = field(default=1, metadata=INHERIT)
    batchnorm: bool = True


@dataclass(frozen=True)
class AggregationSettings:
    """How a round's updates are combined (training/aggregation.py)."""

    rule: str = "mean"
    trim_fraction: float = 0.2
    byzantine: int = 1
    krum_keep: int = 1


@dataclass(frozen=True)
class PrivacySettings:
    """Client-level differential privacy of delta_avg with clients (DP-FedAvg,
    training/privacy/)."""

    clip: float = 0.0
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    target_epsilon: float = 0.0
    accountant: str = "rdp"
    adaptive_clip_quantile: float = 0.0
    clip_learning_rate: float = 0.2
    clip_count_stddev: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.clip > 0

    @property
    def adaptive(self) -> bool:
        """The clip follows a quantile of the update norms (training/privacy/adaptive.py)."""
        return self.adaptive_clip_quantile > 0


@dataclass(frozen=True)
class SecureAggregationSettings:
    """Secure aggregation of delta_avg's sync rounds with clients (SecAgg+,
    training/secure_aggregation/)."""

    enabled: bool = False
    bits: int = 32
    neighbours: int = 0
    threshold: float = 0.6
    clip_range: float = 1.0
    noise_clients: int = 0


@dataclass(frozen=True)
class OutputSettings:
    """What a run writes and how often (training/outputs/plots.py)."""

    sample_every: int = 1
    checkpoint_every: int = 1
    eval_every: int = 1
    eval_n: int = 2000


@functools.cache
def _defaults(section: type) -> dict[str, Any]:
    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            for f in fields(section)}


def defaults(section: type) -> dict[str, Any]:
    """Every key of ``section`` with its default, as an algorithm fills in a request (a
    list or mapping copied, so that no caller changes it for the others)."""
    return _copied(_defaults(section))


def file_defaults(section: type) -> dict[str, Any]:
    """Every key of ``section`` as config.yaml writes it: null where the default comes
    from elsewhere (`INHERIT`, `NULL_IS_DEFAULT`)."""
    nulls = {f.name for f in fields(section) if "null" in f.metadata}
    return {key: None if key in nulls else copy.deepcopy(value)
            for key, value in _defaults(section).items()}


@functools.cache
def _sync_sgd_defaults(kind: str) -> dict[str, Any]:
    return {f.name: f.metadata.get(f"{kind}_default", _defaults(SyncSgdSettings)[f.name])
            for f in fields(SyncSgdSettings) if kind in f.metadata["models"]}


def sync_sgd_defaults(kind: str) -> dict[str, Any]:
    """sync_sgd's keys for a model of ``kind`` (GAN, MLP or MODULE), with their defaults."""
    return _copied(_sync_sgd_defaults(kind))


def model_defaults(section: type, torch_model: bool) -> dict[str, Any]:
    """``section``'s keys whose default depends on the model (`by_model`), with their default
    for a torch model or for the letters MLP."""
    return {f.name: f.metadata["module_default"] if torch_model else _defaults(section)[f.name]
            for f in fields(section) if f.metadata.get("null") == "model"}


def typed_null(section: type, key: str) -> Any:
    """What a value given for ``key``, null in config.yaml, is checked against: the letters
    MLP's default of a `by_model` key (its type is the key's type); else None (any)."""
    for f in fields(section):
        if f.name == key and f.metadata.get("null") == "model":
            return _defaults(section)[key]
    return None


def _copied(values: dict[str, Any]) -> dict[str, Any]:
    return {key: copy.copy(value) if isinstance(value, (list, dict)) else value
            for key, value in values.items()}
