"""Synchronous SGD with K-of-N partial synchronisation: averaged gradients, Adam on the coordinator.

Each round (= iteration, one update of the global model) the coordinator issues N work units
(``units_per_iteration``) of ``images_per_work_unit`` samples each; the first K
(``num_workunits_per_update``) results end the round and the others are cancelled. A node
computes the MEAN gradient of the loss over its unit (in micro-batches of ``batch_size``,
accumulated), the engine averages the K results weighted by their sample counts, and the
coordinator feeds that average to ``torch.optim.Adam`` as ``.grad``. Without BatchNorm, and
with K = N, this is exactly one Adam step on the concatenated global batch (tested).

Work units walk through the training part of the data set in order: the data set is cut into
``ceil(size / images_per_work_unit)`` consecutive index ranges (the last one shorter), and the
units of the whole run take them one after another, N per round, wrapping to the start after
the last one. An epoch (one pass over the data set) is therefore ``ceil(size / unit) / N``
rounds; the N - K units cancelled by the quorum are skipped for that epoch (their samples come
back in the next one). A unit's ``unit_path`` names the file that holds its first sample
(the node's handler checks that it exists); the node reads the range from its own copy.

Models and data sets:

* ``mlp``: the letters MLP (``training/models/mlp.py``) on a letters folder; the training
  part is the ``train_*`` files concatenated in natural order, the validation error is
  measured on ``validate_*`` after every round.
* any torch model (``mlp_classifier`` or a plug-in ``module:attribute``) on the data set
  ``run.dataset`` names: training/algorithms/torch_model.py, with the optimizer ``optimizer``
  (adam, adamw or sgd), ``lr`` and ``weight_decay`` on the coordinator;
* ``dcgan28`` / ``dcgan28-wide`` (twice the channels) / ``dcgan28-tiny`` and the MLP GANs
  ``mlpgan28`` / ``mlpgan28-tiny``: MNIST (``training/data/mnist.py``, the 8,000-image
  training part);
  ``dcgan64`` / ``dcgan64-tiny``: any image folder (``training/data/image_folder.py``).

The maths of each kind of model lives apart: training/algorithms/sync_mlp.py (the letters
MLP), training/algorithms/sync_gan.py (the GANs: simultaneous gradients of G and D, BatchNorm
statistics averaged), training/algorithms/torch_model.py (any other torch model), and the
training part the units walk through, training/algorithms/sync_data.py.

Federated clients (torch models, training/clients/): each round asks the clients sampled
by ``clients.per_round`` (over-selected by ``clients.over_select``), one unit each, computed
only by a node that holds the client: the mean gradient over a batch of
``images_per_work_unit`` of the client's examples (all of them when it holds fewer), drawn
afresh each round from a seed of (seed, round, client). The gradients are averaged weighted
by the batches' sizes; the first K (``num_workunits_per_update``, at most the round's target
count) close the round, so ``units_per_iteration`` is the sampled clients' count instead.

Per-round evaluation must stay cheap: for the MLP and torch models the validation error and
loss; for a GAN, D's error on a fixed probe of real images and fakes (a progress proxy).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.training import aggregation, schema
from thrift_trainer.training.aggregation import SECTION as AGGREGATION
from thrift_trainer.training.algorithms import torch_model
from thrift_trainer.training.algorithms.base import AveragingAlgorithm
from thrift_trainer.training.algorithms.config_checks import (
    ConfigError,
    check_round_size,
    checked_settings,
    split_aggregation,
    with_workload,
)
from thrift_trainer.training.algorithms.sync_data import Examples, TrainingPart, training_part
from thrift_trainer.training.algorithms.sync_gan import GanState, run_gan_unit
from thrift_trainer.training.algorithms.sync_mlp import MlpState, run_mlp_unit
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.roster import ClientRoster, batch_of
from thrift_trainer.training.clients.settings import SECTION as CLIENTS
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.models.names import BUFFER, GAN_MODELS, GRAD, is_module_model
from thrift_trainer.training.optimizer_state import load_optimizer_arrays, optimizer_arrays
from thrift_trainer.training.outputs import gan_metrics
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
)
from thrift_trainer.training.update_checks import specs_of

MLP_BETAS = (0.9, 0.999)  # the usual Adam betas; only the GANs' betas are settings
SCHEDULE_STEPS = "schedule.steps"  # a torch model's optimizer steps, with a schedule
# One config file serves every model, so keys meant for the other kind of model are
# accepted and dropped rather than refused.
ALL_KEYS = frozenset(schema.defaults(schema.SyncSgdSettings))
POSITIVE_INTS = ("images_per_work_unit", "num_workunits_per_update", "units_per_iteration",
                 "batch_size")


# ------------------------------------------------------------------ configuration


def defaults_for(model: str) -> dict[str, Any]:
    """Every config key the model understands, with its default."""
    if model in GAN_MODELS:
        return schema.sync_sgd_defaults(schema.GAN)
    return schema.sync_sgd_defaults(schema.MLP if model == "mlp" else schema.MODULE)


def _check_ranges(config: Mapping[str, Any]) -> None:
    for key in POSITIVE_INTS:
        if config[key] < 1:
            raise ConfigError(f"config key {key!r} must be at least 1, got {config[key]}")
    if config["units_per_iteration"] < config["num_workunits_per_update"]:
        raise ConfigError("config key 'units_per_iteration' (N) must be at least "
                          "'num_workunits_per_update' (K)")
    for key in ("lr", "lr_g", "lr_d"):
        if key in config and not (math.isfinite(config[key]) and config[key] > 0):
            raise ConfigError(f"config key {key!r} must be a positive number, got {config[key]}")
    for key in ("beta1", "beta2"):
        if key in config and not 0.0 <= config[key] < 1.0:
            raise ConfigError(f"config key {key!r} must be in [0, 1), got {config[key]}")
    if not 0 <= config["seed"] < 2**31:
        raise ConfigError(f"config key 'seed' must be in [0, 2**31), got {config['seed']}")
    if "optimizer" in config and config["optimizer"] not in torch_model.OPTIMIZERS:
        raise ConfigError(f"config key 'optimizer' must be one of "
                          f"{', '.join(torch_model.OPTIMIZERS)}, got {config['optimizer']!r}")
    if "weight_decay" in config and not (math.isfinite(config["weight_decay"])
                                         and config["weight_decay"] >= 0):
        raise ConfigError(f"config key 'weight_decay' must be 0 or more, "
                          f"got {config['weight_decay']}")


# ------------------------------------------------------------------ the algorithm


class SyncSGD(AveragingAlgorithm):
    """See the module docstring."""

    name = "sync_sgd"
    # its keys, types and defaults; each names the models it applies to (training/schema.py)
    Config = schema.SyncSgdSettings
    models = ("mlp", *GAN_MODELS)
    asynchronous = True  # gradients can be applied one by one as they arrive
    splits_units = True
    clients = True  # a torch model's units may be federated clients (training/clients/)

    @classmethod
    def takes_clients(cls, model: str) -> str | None:
        if not is_module_model(model):
            return ("sync_sgd takes federated clients with torch models (mlp_classifier or a "
                    f"plug-in); {model!r} walks its data set in index ranges")
        return None

    @classmethod
    def writes_weights(cls, model: str) -> bool:
        # a torch model or a GAN only loads them into its modules
        return not is_module_model(model) and model not in GAN_MODELS

    @classmethod
    def trains(cls, model: str) -> bool:
        return model in cls.models or is_module_model(model)

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """topk for the MLP and other torch models (whose buffers, BatchNorm statistics,
        travel whole under it), not for the GANs."""
        up = {"fp16", "int8"} if model in GAN_MODELS else {"fp16", "int8", "topk"}
        return {"up": frozenset(up), "down": frozenset({"fp16"})}

    @classmethod
    def unit_slot(cls, unit: UnitSpec, config: Mapping[str, Any]) -> str:
        """Unit ids run on over the iterations (unit<number>-<start>-<stop>); the slot is
        the unit's place in its iteration."""
        number = re.match(r"unit(\d+)-", unit.unit_id)
        per_iteration = config.get("units_per_iteration")
        if number is None or not isinstance(per_iteration, int) or per_iteration < 1:
            return unit.unit_id
        return f"slot{int(number.group(1)) % per_iteration}"

    # ------------------------------------------------------------- node half
    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config with every default filled in (N defaults to K + 1: one spare unit per
        round, so a straggler or a unit stuck in a load delay does not hold the round)."""
        cls.check_model(model)
        defaults = defaults_for(model)
        given, (config, aggregation) = config, split_aggregation(config)
        if "units_per_iteration" not in config:
            k = config.get("num_workunits_per_update", defaults["num_workunits_per_update"])
            if isinstance(k, int):
                defaults["units_per_iteration"] = k + 1
        checked = checked_settings(config, defaults, cls.name, accepted=ALL_KEYS)
        _check_ranges(checked)
        return with_workload({**checked, AGGREGATION: aggregation}, given)

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        config = cls.unit_config(job)
        if job.unit.client is not None:
            output = torch_model.sync_examples_unit(job, dataset_dir, _client_batch(job, config),
                                                    config["batch_size"])
            if output is None:
                raise ConfigError(f"unit {job.unit.unit_id} holds no example")
            return output
        start, stop = cls._unit_range(job)
        return _mean_gradient(job, config, dataset_dir, start, stop)

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """The mean gradient over a share of the unit's range cut at micro-batch bounds; a
        GAN's share takes its rows of the unit's noise, so the shares' sample-weighted
        mean is the unit's gradient."""
        config = cls.unit_config(job)
        if job.unit.client is not None:
            batch = _client_batch(job, config)

            def share(setup: Any) -> np.ndarray:
                chosen = batch(setup)
                return chosen[slice(*part_bounds(len(chosen), part, parts,
                                                 config["batch_size"]))]
            return torch_model.sync_examples_unit(job, dataset_dir, share, config["batch_size"])
        start, stop = cls._unit_range(job)
        lo, hi = part_bounds(stop - start, part, parts, config["batch_size"])
        if lo == hi:
            return None
        return _mean_gradient(job, config, dataset_dir, start + lo, start + hi,
                              (lo, stop - start))

    @classmethod
    def _unit_range(cls, job: UnitJob) -> tuple[int, int]:
        start, stop = job.unit.index_start, job.unit.index_stop
        if start is None or stop is None:
            raise ConfigError(f"unit {job.unit.unit_id} has no index range; {cls.name} needs one")
        return start, stop

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        super().__init__(model, config, dataset_dir, dataset)
        self.roster: ClientRoster | None = None
        # The first K results of a round are combined.
        check_round_size(self.config[AGGREGATION], self.quorum(self.config["units_per_iteration"]))
        self.unit_size = self.config["images_per_work_unit"]
        self.state: MlpState | GanState | torch_model.SyncState
        if is_module_model(model):
            setup = torch_model.setup_of(model, self.config, self.dataset, dataset_dir)
            self.data: TrainingPart | Examples = Examples(len(setup.data.train))
            self.state = torch_model.SyncState(setup, self.config)
            self._deal_clients(setup)
        elif model == "mlp":
            self.data = training_part(model, dataset_dir)
            self.state = MlpState(self.config, dataset_dir, MLP_BETAS)
        else:
            data = training_part(model, dataset_dir)
            self.data = data
            self.state = GanState(model, self.config, data.probe())
        self.units_per_epoch = math.ceil(len(self.data) / self.unit_size)

    @property
    def applies_float32(self) -> bool:  # type: ignore[override]
        """The MLP and torch models step on a float32 average (the GANs keep float64)."""
        return isinstance(self.state, MlpState | torch_model.SyncState)

    def keep_each_version(self) -> None:
        if isinstance(self.state, torch_model.SyncState):
            self.state.keep_versions()

    def _deal_clients(self, setup: Any) -> None:
        """A run with federated clients: their roster (a partition's now; node-resident
        ones once their nodes announce them)."""
        clients = clients_settings(self.config.get(CLIENTS))
        if not clients.enabled:
            return
        from thrift_trainer.training.clients.data_parts import parts_of

        self.roster = ClientRoster(clients, self.config["seed"])
        if not clients.on_nodes:
            self.roster.deal(*parts_of(setup, clients, self.config["seed"]))
            check_round_size(self.config[AGGREGATION], self.quorum(len(self.plan_round(1))))

    @property
    def rounds_from_passes(self) -> bool:  # type: ignore[override]
        """Index ranges come from passes over the data (units cut by K-of-N are trained on
        later in the pass); federated clients are sampled per round."""
        return self.roster is None

    def take_clients(self, sizes: dict[str, int],
                     labels: dict[str, dict[int, int] | None]) -> PartitionRecord:
        if self.roster is None:
            raise ConfigError("this run has no federated clients")
        record = self.roster.take(sizes, labels)
        check_round_size(self.config[AGGREGATION], self.quorum(len(self.plan_round(1))))
        return record

    @property
    def partition(self) -> PartitionRecord | None:
        return None if self.roster is None else self.roster.record

    def initial_weights(self) -> Weights:
        return self.state.weights()

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        if self.roster is not None:
            return self.roster.round_units(round_index)
        count = self.config["units_per_iteration"]
        return [self._unit((round_index - 1) * count + j) for j in range(count)]

    def _unit(self, number: int) -> UnitSpec:
        """The run's ``number``-th unit (0-based): the next range, wrapping at the end."""
        start = number % self.units_per_epoch * self.unit_size
        stop = min(start + self.unit_size, len(self.data))
        return UnitSpec(unit_id=f"unit{number}-{start}-{stop}",
                        unit_path=self.data.path_of(start), index_start=start, index_stop=stop)

    def plan_pass(self, pass_index: int) -> list[UnitSpec]:
        """Every range of the data set once; unit numbers run on over the passes."""
        first = (pass_index - 1) * self.units_per_epoch
        return [self._unit(first + j) for j in range(self.units_per_epoch)]

    def staleness_scaled(self, name: str) -> bool:
        """Gradients are scaled; BatchNorm statistics are states, averaged as they are."""
        return name.startswith(GRAD)

    def unit_samples(self, unit: UnitSpec) -> int | None:
        if self.roster is not None:
            examples = self.roster.examples(unit)
            return None if examples is None else min(examples, self.unit_size)
        if unit.index_start is None or unit.index_stop is None:
            return None
        return unit.index_stop - unit.index_start

    def epochs_done(self, round_index: int) -> float | None:
        """K units of each round count; the cancelled ones come round again next epoch
        (clients: sampled batches, no passes)."""
        if self.roster is not None:
            return None
        return round_index * self.quorum(self.config["units_per_iteration"]) / self.units_per_epoch

    def quorum(self, num_units: int) -> int:
        """K of the round's units; with clients, at most the round's target count."""
        if self.roster is not None:
            return min(self.config["num_workunits_per_update"], self.roster.target(),
                       num_units)
        return min(self.config["num_workunits_per_update"], num_units)

    def expected_update(self, weights: Weights) -> TensorSpecs:
        """Gradients of the parameters and the BatchNorm buffers, shaped and typed as the
        weights they belong to."""
        if isinstance(self.state, torch_model.SyncState):
            return torch_model.expected_update(self.state.module, weights, gradients=True)
        params = set(self.state.parameter_names())
        return {(GRAD if name in params else BUFFER) + name: spec
                for name, spec in specs_of(weights).items()}

    def aggregate(self, round_index: int, weights: Weights, results: Sequence[UnitResult],
                  failures: Sequence[UnitFailure]) -> Weights:
        """A torch model's mean (the default rule) goes into its optimizer a block at a
        time as it is made (`SyncState.step_on_mean`: the same bits as the mean applied
        whole, without holding it); any other rule or model combines, then applies."""
        if results and isinstance(self.state, torch_model.SyncState) and self._plain_mean:
            return self.state.step_on_mean(weights, [r.update for r in results],
                                           [r.num_samples for r in results])
        return super().aggregate(round_index, weights, results, failures)

    @property
    def _plain_mean(self) -> bool:
        settings = self.config[AGGREGATION]
        return aggregation.rule_of(settings["rule"])(settings) is aggregation.weighted_mean

    def apply(self, weights: Weights, combined: Weights) -> Weights:
        return self.state.step(weights, combined)

    def evaluate(self, weights: Weights) -> RoundEval:
        return self.state.evaluate(weights)

    def model_description(self) -> dict[str, Any]:
        return self.state.description()

    def sample_images(self, weights: Weights, n: int, seed: int = 0) -> np.ndarray | None:
        """n images from ``weights``' generator (not necessarily the last one stepped:
        a saved state's, for instance)."""
        if not isinstance(self.state, GanState):
            return None
        self.state.load(weights)
        return gan_models.sample_images(self.state.g, n, seed).numpy()

    def score(self, weights: Weights, n: int) -> dict[str, float]:
        """IS and FID (classifier features and logits) of ``weights``' generator, for
        the 28x28 MNIST models."""
        if not (isinstance(self.state, GanState) and gan_models.is_mnist_model(self.model)):
            return {}
        self.state.load(weights)
        images = gan_models.sample_images(self.state.g, n, seed=gan_metrics.SCORE_SEED)
        return gan_metrics.score_images(images, n, root=self.dataset_dir).to_dict()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Each coordinator optimizer's state, under ``optim.<group>.``; with a run's
        learning-rate schedule, the steps taken (``schedule.steps``) too."""
        # views, not copies: a checkpoint writes them out at once (Adam's moments are
        # twice a big model)
        state = {key: value for group, (named, optimizer) in self.state.optimizers().items()
                 for key, value in optimizer_arrays(named, optimizer, f"optim.{group}.",
                                                    copy=False).items()}
        if self._scheduled:
            state[SCHEDULE_STEPS] = np.array(self.state.steps, dtype=np.int64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        for group, (named, optimizer) in self.state.optimizers().items():
            load_optimizer_arrays(named, optimizer, state, f"optim.{group}.")
        if self._scheduled and SCHEDULE_STEPS in state:
            self.state.steps = int(state[SCHEDULE_STEPS])

    @property
    def _scheduled(self) -> bool:
        return isinstance(self.state, torch_model.SyncState) and \
            not self.state.schedule.is_constant


def _client_batch(job: UnitJob, config: Mapping[str, Any]) -> Any:
    """The examples of the unit's client that its round's gradient is taken over, as
    `torch_model.sync_examples_unit` takes them (a function of the node's setup)."""
    from thrift_trainer.training.clients import data_parts

    client, seed = job.unit.client or "", config["seed"]
    settings = clients_settings(config.get(CLIENTS))
    examples = data_parts.resident_examples(client) if settings.on_nodes \
        else data_parts.client_examples(client, settings, seed)

    def batch(setup: Any) -> np.ndarray:
        return batch_of(examples(setup), config["images_per_work_unit"], seed, job.round,
                        client)
    return batch


def _mean_gradient(job: UnitJob, config: Mapping[str, Any], dataset_dir: Path, start: int,
                   stop: int, share: tuple[int, int] | None = None) -> UnitOutput:
    """The node's result for examples ``[start, stop)`` of the training part, by the
    model's kind; ``share`` (first row, unit size): a GAN's range is that share of a unit."""
    if is_module_model(job.model):
        return torch_model.sync_unit(job, dataset_dir, start, stop, config["batch_size"])
    data = training_part(job.model, dataset_dir)
    if job.model == "mlp":
        return run_mlp_unit(job, config, *data.load(start, stop))
    return run_gan_unit(job, config, data.load(start, stop), share)
