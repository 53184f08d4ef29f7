"""Delta averaging (federated averaging, local SGD): the assignment's algorithm, and more.

Node half: train `epochs` local epochs (or `local_steps` optimizer steps) on one shard from
the given weights and return final - initial. Coordinator half: a weighted average of the
round's deltas, applied through a server optimizer ("avg" adds it, as in the assignment;
"momentum" is FedAvgM, "adam" FedAdam, "nesterov" DiLoCo's outer step), then the
validation error.

* The letters MLP (``mlp``, numpy on the nodes): one unit per `train_*` file, the
  validation error on `validate_*`; it reproduces the assignment's numbers bit for bit.
* Any torch model (``mlp_classifier`` or a plug-in ``module:attribute``): the training part
  of ``run.dataset`` cut into `units` index ranges, local training with `local_optimizer`
  (gd, sgd, adam or adamw with `weight_decay`), training/algorithms/torch_model.py. With
  adamw inner steps and a nesterov server optimizer this is DiLoCo (Douillard et al. 2023).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.training import server_optim
from thrift_trainer.training.aggregation import SECTION as AGGREGATION
from thrift_trainer.training.algorithms.base import AveragingAlgorithm
from thrift_trainer.training.algorithms.config_checks import (
    ConfigError,
    check_round_size,
    checked_settings,
    split_aggregation,
    with_workload,
)
from thrift_trainer.training.algorithms.delta_plans import ClientPlan, LettersPlan, RangePlan
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.settings import SECTION as CLIENTS
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.models import mlp
from thrift_trainer.training.models.names import BUFFER, is_module_model
from thrift_trainer.training.models.settings import SECTION as MODEL
from thrift_trainer.training.models.settings import ModelSettings
from thrift_trainer.training.privacy.accounting import BUFFERED, Sampling
from thrift_trainer.training.privacy.release import PrivateRelease
from thrift_trainer.training.privacy.settings import OFF as PRIVACY_OFF
from thrift_trainer.training.privacy.settings import SECTION as PRIVACY
from thrift_trainer.training.privacy.settings import settings_from as privacy_settings
from thrift_trainer.training.schema import DeltaAvgSettings, defaults, model_defaults
from thrift_trainer.training.unit_parts import part_bounds
from thrift_trainer.training.units import (
    RoundEval,
    TensorSpecs,
    UnitFailure,
    UnitJob,
    UnitOutput,
    UnitResult,
    UnitSpec,
    Weights,
    unit_seed,
)
from thrift_trainer.training.update_checks import specs_of

LOCAL_OPTIMIZERS = ("gd", "sgd", "adam", "adamw")
MLP_OPTIMIZERS = ("gd", "sgd", "adam")  # the numpy MLP's (training/models/mlp.py)
TORCH_ONLY = ("local_steps", "weight_decay")  # keys the numpy MLP cannot use
NUMPY_MLP_ONLY = ("hidden", "compat", "scale_features")  # keys a torch model has no use for
PRIVACY_PREFIX = "privacy."  # a private run's own keys in the checkpoint's algorithm state
ROSTER_KEY = "privacy.roster"  # node-resident clients the sampling rate was computed from


class DeltaAveraging(AveragingAlgorithm):
    name = "delta_avg"
    Config = DeltaAvgSettings  # its keys, types and defaults (training/schema.py)
    models = ("mlp",)
    splits_units = True
    asynchronous = True  # deltas can be applied one by one as they arrive
    clients = True  # a torch model's units may be federated clients (training/clients/)
    local_rounds = True  # a delta is a change of the model, which relays can apply
    private = True  # client-level differential privacy (training/privacy/)
    privacy = PRIVACY_OFF  # the run's settings, read from its config at construction

    @classmethod
    def takes_clients(cls, model: str) -> str | None:
        if model == "mlp":
            return ("the letters MLP's units are its train_* files; federated clients are "
                    "for torch models (mlp_classifier or a plug-in)")
        return None

    @property
    def uses_torch(self) -> bool:  # type: ignore[override]
        """The letters MLP runs in numpy on the nodes; other models in torch."""
        return self.model != "mlp"

    @classmethod
    def writes_weights(cls, model: str) -> bool:
        return not is_module_model(model)  # a torch model only loads them into its module

    @classmethod
    def trains(cls, model: str) -> bool:
        return model in cls.models or is_module_model(model)

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """Every codec: a torch model's buffers (BatchNorm statistics) travel whole under
        topk, which sparsifies the changes only."""
        up = {"fp16", "int8", "topk"}
        return {"up": frozenset(up), "down": frozenset({"fp16"})}

    @classmethod
    def add_update(cls, weights: Weights, update: Weights) -> Weights:
        """Deltas added; a torch model's buffers (``buffer.<name>``) installed as sent."""
        return {name: update[BUFFER + name] if BUFFER + name in update else
                value + update[name] for name, value in weights.items()}

    @classmethod
    def update_between(cls, before: Weights, after: Weights, like: Weights) -> Weights:
        """The change of each parameter; a torch model's buffers (those ``like`` holds as
        ``buffer.<name>``) as their states."""
        buffers = {name[len(BUFFER):] for name in like if name.startswith(BUFFER)}
        return {(BUFFER + name if name in buffers else name):
                (after[name] if name in buffers else after[name] - before[name])
                for name in before}

    # ------------------------------------------------------------- node half
    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        cls.check_model(model)
        given, (config, aggregation) = config, split_aggregation(config)
        # a key left out, or null: its default, for some the run's kind of model's (by_model)
        known = {**defaults(DeltaAvgSettings),
                 **model_defaults(DeltaAvgSettings, is_module_model(model))}
        checked = checked_settings(config, known, cls.name)
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
        if model == "mlp":
            _check_numpy_mlp(checked)
        elif checked["units"] < 1 or checked["local_steps"] < 0:
            raise ConfigError("config keys 'units' must be at least 1 and 'local_steps' 0 or more")
        if is_module_model(model):  # a torch model is built from its model section
            checked = {k: v for k, v in checked.items() if k not in NUMPY_MLP_ONLY}
        try:
            server_optim.make_server_optimizer(checked["server_optimizer"],
                                               **_server_kwargs(checked))
        except ValueError as exc:
            raise ConfigError(f"config key 'server_optimizer': {exc}") from None
        return with_workload({**checked, AGGREGATION: aggregation}, given)

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        if job.model != "mlp":
            if job.unit.evaluates:
                return cls._evaluate_client(job, dataset_dir)
            output = cls._train_examples(job, dataset_dir, cls._examples(job))
            if output is None:
                raise ConfigError(f"unit {job.unit.unit_id} holds no example")
            return output
        return cls._train_rows(job, *load_letters(dataset_dir / job.unit.unit_path))

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """Local training on a share of the unit's rows; the node averages the shares'
        deltas (local averaging, not one sequential training of the unit)."""
        if job.model != "mlp":
            examples = cls._examples(job)

            def share(setup: Any) -> Any:
                chosen = examples(setup)
                lo, hi = part_bounds(len(chosen), part, parts)
                return chosen[lo:hi]
            return cls._train_examples(job, dataset_dir, share)
        features, labels = load_letters(dataset_dir / job.unit.unit_path)
        lo, hi = part_bounds(len(labels), part, parts)
        return cls._train_rows(job, features[lo:hi], labels[lo:hi]) if hi > lo else None

    @classmethod
    def _train_rows(cls, job: UnitJob, features: Any, labels: Any) -> UnitOutput:
        config = cls.unit_config(job)
        spec = _spec(config)
        _check_weights(job.weights, mlp.init_params(spec, seed=0))
        local = mlp.LocalTraining(
            epochs=config["epochs"],
            eta=config["eta"],
            optimizer=config["local_optimizer"],
            batch_size=config["batch_size"],
            seed=unit_seed(config["seed"], job.round, job.unit.seed_id),
        )
        trained, stats = mlp.train_local(job.weights, features, labels, spec, local,
                                         job.control.step)
        delta = {name: trained[name] - job.weights[name] for name in job.weights}
        return UnitOutput(
            update=delta, num_samples=len(labels), loss=float(stats.loss), error=float(stats.error)
        )

    @classmethod
    def _examples(cls, job: UnitJob) -> Callable[[Any], Any]:
        """The unit's examples of a torch model's training part: its client's part, or
        its index range."""
        from thrift_trainer.training.algorithms import torch_model  # torch only for torch models

        if job.unit.client is None:
            return torch_model.index_range(*_index_range(job.unit))
        from thrift_trainer.training.clients import data_parts

        config = cls.unit_config(job)
        settings = clients_settings(config.get(CLIENTS))
        if settings.on_nodes:  # the node's own data is the client (its node checked it)
            return data_parts.own_examples(settings, config["seed"], job.unit.client)
        return data_parts.client_examples(job.unit.client, settings, config["seed"])

    @classmethod
    def _evaluate_client(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        """Federated evaluation: the weights scored on the client's validation part."""
        from thrift_trainer.training.algorithms import torch_model  # torch only for torch models
        from thrift_trainer.training.clients import data_parts

        config = cls.unit_config(job)
        settings = clients_settings(config.get(CLIENTS))
        if job.unit.client is None or not settings.enabled:
            raise ConfigError(f"unit {job.unit.unit_id}: only a federated client's unit "
                              "is evaluated on its node")
        split = data_parts.validation_split(job.unit.client, settings, config["seed"])
        return torch_model.evaluate_unit(job, dataset_dir, split, config["batch_size"])

    @classmethod
    def _train_examples(cls, job: UnitJob, dataset_dir: Path,
                        examples: Callable[[Any], Any]) -> UnitOutput | None:
        """A torch model's local training on ``examples(setup)``; None when there are none
        (an empty share of a unit)."""
        from thrift_trainer.training.algorithms import torch_model  # torch only for torch models
        from thrift_trainer.training.models.module_training import LocalSteps

        config = cls.unit_config(job)
        local = LocalSteps(optimizer=config["local_optimizer"], lr=config["eta"],
                           batch_size=config["batch_size"], epochs=config["epochs"],
                           steps=config["local_steps"], weight_decay=config["weight_decay"],
                           seed=unit_seed(config["seed"], job.round, job.unit.seed_id),
                           round=job.round)
        return torch_model.local_unit(job, dataset_dir, examples, local,
                                      cls.local_penalty(job))

    @classmethod
    def local_penalty(cls, job: UnitJob) -> Callable[..., Any] | None:
        """A term a torch model's local steps add to their loss: ``penalty(module,
        weights=...)`` given the module in training and the round's weights (numpy, by
        name), returning a 0-d tensor. None by default; FedProx's proximal term
        (examples/plugins/fedprox.py) is one."""
        return None

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        super().__init__(model, config, dataset_dir, dataset)
        self.optimizer = server_optim.make_server_optimizer(
            self.config["server_optimizer"], **_server_kwargs(self.config)
        )
        if model != "mlp":  # run.server_lr_schedule, over rounds
            self.optimizer.schedule = ModelSettings.from_mapping(
                self.config.get(MODEL)).server_schedule()
        clients = clients_settings(self.config.get(CLIENTS))
        if model == "mlp":
            self._plan: LettersPlan | RangePlan = LettersPlan(_spec(self.config), dataset_dir)
        elif clients.enabled:
            self._plan = ClientPlan(self.config, self.optimizer, model, self.dataset,
                                    dataset_dir, clients)
        else:
            self._plan = RangePlan(self.config, self.optimizer, model, self.dataset,
                                    dataset_dir)
        self.privacy = privacy_settings(self.config.get(PRIVACY))
        self._release = PrivateRelease(self.privacy)
        if isinstance(self._plan, ClientPlan):  # draws keyed by the key the release holds
            self._plan.noise_key = lambda: self._release.key
        self._buffer_size: int | None = None  # a private buffered run's (release_buffers)
        # every unit of a round is averaged (node-resident clients: once they are known)
        if not clients.on_nodes:
            check_round_size(self.config[AGGREGATION], self._round_size())
        if self.privacy.enabled:
            self._check_private()

    # ---------------------------------------------------- differential privacy
    def _check_private(self) -> None:
        """DP-FedAvg clips deltas: a torch model's buffers (BatchNorm statistics) travel as
        states, not changes, and would escape the clipping."""
        if not isinstance(self._plan, ClientPlan):
            raise ConfigError("privacy: client-level privacy needs federated clients "
                              "(clients.count)")
        buffers = [name for name in self.initial_weights() if name.startswith(BUFFER)]
        if buffers:
            raise ConfigError(f"privacy: the model has buffers ({buffers[0][len(BUFFER):]}, "
                              f"...), states that cannot be clipped; use a model without "
                              f"BatchNorm")

    def use_noise_key(self, key: bytes) -> None:
        """Key the run's noise and client draws with ``key``, the secret the coordinator
        made when the run started (training/privacy/noise_key.py); a checkpoint's
        replaces it on a resume."""
        self._release.use_key(key)

    @property
    def noise_key(self) -> bytes | None:
        """The key of a private run's noise and client draws (None until it is given)."""
        return self._release.key

    def _round_size(self) -> int:
        """The updates a round averages: round 1's units; a private run's target count,
        its draw being keyed by the noise key it is given after construction."""
        if self.privacy.enabled and isinstance(self._plan, ClientPlan):
            return self._plan.clients.target(len(self._plan.units))
        return self.quorum(len(self.plan_round(1)))

    def release_buffers(self, buffer_size: int) -> None:
        """A private run in buffered mode (FedBuff): each buffer of ``buffer_size`` clients
        is one release, its noised sum divided by the buffer size and accounted as a
        Gaussian mechanism without sampling (training/privacy/accounting.py)."""
        self._buffer_size = buffer_size

    def privacy_sampling(self) -> Sampling | None:
        """How the run's rounds sample clients, for the accounting; None without privacy,
        and for node-resident clients until their nodes have announced them."""
        if not self.privacy.enabled or not isinstance(self._plan, ClientPlan):
            return None
        clients = self._plan.clients
        count = len(self._plan.units)
        if not count:
            return None
        if self._buffer_size is not None:
            return Sampling(BUFFERED, count, self._buffer_size)
        return Sampling(self.privacy_sampling_kind, count, clients.target(count))

    @property
    def privacy_sampling_kind(self) -> str:
        """fixed, poisson or buffered: known before the clients are (the pairing with the
        accountant is checked at the request)."""
        if self._buffer_size is not None:
            return BUFFERED
        return "poisson" if clients_settings(self.config.get(CLIENTS)).poisson else "fixed"

    def aggregate(self, round_index: int, weights: Weights, results: Sequence[UnitResult],
                  failures: Sequence[UnitFailure]) -> Weights:
        """With privacy: the clipped deltas' noised sum over the expected number of clients
        (DP-FedAvg), through the server optimizer; else the aggregation rule's."""
        sampling = self.privacy_sampling()
        if sampling is None:
            return super().aggregate(round_index, weights, results, failures)
        if sampling.kind == BUFFERED:  # a client counts once per release
            results = _once_per_client(results)
        update = self._release.mean([r.update for r in results], weights, sampling.expected,
                                    round_index)
        return self.apply(weights, update)

    def privacy_figures(self) -> dict[str, float]:
        """A private run's figures besides epsilon: with adaptive clipping, the clip the
        last round used (itself a noised release)."""
        return {"clip": self._release.last_clip} if self.privacy.adaptive else {}

    def initial_weights(self) -> Weights:
        return self._plan.initial_weights(self.config["seed"])

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        """The round's units; a private run's clients drawn under its noise key."""
        if self.privacy.enabled and isinstance(self._plan, ClientPlan):
            self._release.checked_key()  # never a draw from the public seed alone
        if isinstance(self._plan, RangePlan):
            return self._plan.round_units(round_index)
        return list(self._plan.units)

    def quorum(self, num_units: int) -> int:
        """All of a round's units; with over-selected clients, the round's target."""
        if isinstance(self._plan, RangePlan):
            return self._plan.quorum(num_units)
        return num_units

    def take_clients(self, sizes: dict[str, int],
                     labels: dict[str, dict[int, int] | None]) -> PartitionRecord:
        """Node-resident clients as announced. A private run keeps the clients of its first
        announcement for good (its roster): its sampling rate, and so the epsilon it
        reports, is computed from them, so clients announced later are never sampled, and
        clients whose node left stay in the draw (a drawn one drops out of its round)."""
        if not isinstance(self._plan, ClientPlan):
            raise ConfigError("this run has no node-resident clients")
        if self.privacy.enabled and self._plan.units:
            return self._plan.record
        record = self._plan.take_clients(sizes, labels)
        check_round_size(self.config[AGGREGATION], self._round_size())
        return record

    @property
    def partition(self) -> PartitionRecord | None:
        return self._plan.partition if isinstance(self._plan, ClientPlan) else None

    def client_units(self) -> list[UnitSpec] | None:
        return list(self._plan.units) if isinstance(self._plan, ClientPlan) else None

    def clients_at_once(self, capacity: int) -> int:
        """FedBuff's concurrency: ``clients.per_round`` of the clients there are (0: as
        many as the nodes take at once)."""
        if isinstance(self._plan, ClientPlan) and self._plan.clients.per_round:
            return self._plan.clients.target(len(self._plan.units))
        return capacity

    def evaluation_units(self, round_index: int, rounds: int) -> list[UnitSpec]:
        if not isinstance(self._plan, ClientPlan):
            return []
        return self._plan.evaluation_units(round_index, rounds)

    @property
    def scores_accuracy(self) -> bool:
        return isinstance(self._plan, ClientPlan) and self._plan.scores_accuracy

    def unit_samples(self, unit: UnitSpec) -> int | None:
        return self._plan.samples(unit)

    def expected_update(self, weights: Weights) -> TensorSpecs:
        """A delta has exactly the weights' tensors, shapes and dtypes (a torch model's
        buffers come as ``buffer.<name>``)."""
        if isinstance(self._plan, RangePlan):
            return self._plan.expected_update(weights)
        return specs_of(weights)

    def staleness_scaled(self, name: str) -> bool:
        """Deltas are scaled by staleness; a torch model's buffers are states."""
        return not name.startswith(BUFFER)

    def apply(self, weights: Weights, combined: Weights) -> Weights:
        if isinstance(self._plan, RangePlan):
            return self._plan.state.step(weights, combined)
        return self.optimizer.step(weights, combined)

    def evaluate(self, weights: Weights) -> RoundEval:
        return self._plan.evaluate(weights)

    def model_description(self) -> dict[str, Any]:
        return self._plan.description()

    def state_dict(self) -> dict[str, Any]:
        """The server optimizer's state; a private run's adds its noise key, the clip in
        force and, with node-resident clients, the roster its sampling rate was computed
        from."""
        state = {**self.optimizer.state_dict(), **self._release.state_dict()}
        if self.privacy.enabled and self.clients_on_nodes and isinstance(self._plan, ClientPlan):
            state[ROSTER_KEY] = np.array(self._plan.record.to_json())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        own = {key: value for key, value in state.items() if key.startswith(PRIVACY_PREFIX)}
        self.optimizer.load_state_dict({key: value for key, value in state.items()
                                        if key not in own})
        self._release.load_state_dict(own)
        if ROSTER_KEY in own and isinstance(self._plan, ClientPlan):
            record = PartitionRecord.from_json(str(own[ROSTER_KEY]))
            self._plan.take_clients(dict(zip(record.names, record.sizes, strict=True)), {})
            self._plan.record = record

    @property
    def clients_on_nodes(self) -> bool:
        return clients_settings(self.config.get(CLIENTS)).on_nodes


def _index_range(unit: UnitSpec) -> tuple[int, int]:
    if unit.index_start is None or unit.index_stop is None:
        raise ConfigError(f"unit {unit.unit_id} has no index range; a torch model's units "
                          "are ranges of its training part")
    return unit.index_start, unit.index_stop


def _check_numpy_mlp(config: Mapping[str, Any]) -> None:
    """The letters MLP trains in numpy: refuse what only torch models can do."""
    if config["local_optimizer"] not in MLP_OPTIMIZERS:
        raise ConfigError(f"config key 'local_optimizer': the letters MLP trains with one of "
                          f"{', '.join(MLP_OPTIMIZERS)} (adamw is for torch models)")
    for key in TORCH_ONLY:
        if config[key] != defaults(DeltaAvgSettings)[key]:
            raise ConfigError(f"config key {key!r} is for torch models; the letters MLP "
                              f"trains epochs with {config['local_optimizer']}")


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
    if name in ("momentum", "nesterov"):
        return {"lr": config["server_lr"], "beta": config["server_momentum"]}
    if name == "adam":
        return {"lr": config["server_lr"]}
    return {}


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


def _once_per_client(results: Sequence[UnitResult]) -> list[UnitResult]:
    """A buffer's results, each client's first only. The stream draws no client whose
    result waits in the buffer (engine/stream_state.py), so a second one cannot arrive;
    were it to, it must not double the client's share of the sum the noise is calibrated
    to."""
    seen: set[str | None] = set()
    kept = []
    for result in results:
        if result.unit.client is None or result.unit.client not in seen:
            seen.add(result.unit.client)
            kept.append(result)
    return kept
