"""FL-GAN: federated averaging of whole GANs, the MD-GAN paper's competitor.

One round is one federated round. The coordinator sends the global (G, D), parameters and
BatchNorm buffers, to N worker slots (``workers``), one unit each. A node trains the pair
for ``local_epochs`` E passes over its slot's iid shard of the MNIST training part
(training/gan_training.py) in batches of ``batch_size`` b, with the usual alternating DCGAN
step (a D step, then a G step against the updated D), and returns the full ``state_dict``
of both networks. Buffers are part of it: averaging the parameters without BN's running
statistics gives garbage samples in eval mode.

Each round starts a fresh Adam per network on the node: the paper averages the networks
only, and moment estimates made for one node's model would not fit the average anyway.

The coordinator averages the full state weighted by each slot's shard size (the
configured `aggregation` rule, the weighted mean by default), and that average is the
next global model (BN's integer batch counter is rounded). The per-round evaluation is
sync_sgd's cheap progress signal: the global D's error on a fixed probe of 64 held-out
real images and 64 fakes from fixed noise.

Federated clients (``clients``, placement partition): the MNIST training part is dealt to
the clients by the run's partitioner (iid, dirichlet label skew, ...); each round asks the
clients ``clients.per_round`` samples (instead of ``workers`` slots), one unit each,
computed only by a node that holds the client, which trains the pair on the client's
images; the states are averaged weighted by the clients' image counts. Every client must
hold at least one batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrift_trainer.training.aggregation import SECTION as AGGREGATION
from thrift_trainer.training.algorithms.base import AveragingAlgorithm
from thrift_trainer.training.algorithms.config_checks import (
    ConfigError,
    check_round_size,
    checked_settings,
    split_aggregation,
    with_workload,
)
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.roster import ClientRoster
from thrift_trainer.training.clients.settings import SECTION as CLIENTS
from thrift_trainer.training.clients.settings import ClientsSettings, client_index
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.data import mnist
from thrift_trainer.training.gan_training import (
    PROBE_SEED,
    PROBE_SIZE,
    adam,
    alternating_step,
    batch_indices,
    check_adam,
    check_client_sizes,
    check_positive,
    check_shards,
    client_parts,
    d_loss,
    noise,
    real_batch,
    shard_indices,
    slot_of,
    slot_unit_id,
    training_size,
)
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.outputs import gan_metrics
from thrift_trainer.training.schema import FlGanSettings, defaults
from thrift_trainer.training.unit_parts import part_bounds
from thrift_trainer.training.units import (
    RoundEval,
    TensorSpecs,
    UnitJob,
    UnitOutput,
    UnitSpec,
    Weights,
)
from thrift_trainer.training.update_checks import specs_of

MODELS = tuple(name for name in gan_models.GAN_MODELS if gan_models.is_mnist_model(name))
UNIT_TAG = "fl"


def _check_config(model: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if model not in MODELS:
        raise ConfigError(f"algorithm 'fl_gan' trains models {MODELS}, not {model!r}")
    given, (config, aggregation) = config, split_aggregation(config)
    checked = checked_settings(config, defaults(FlGanSettings), "fl_gan")
    check_positive(checked, ("workers", "local_epochs", "batch_size"))
    check_adam(checked)
    given = {key: value for key, value in given.items() if key == CLIENTS}
    if clients_settings(given.get(CLIENTS)).on_nodes:
        raise ConfigError("clients.placement nodes: fl_gan's clients are parts of the MNIST "
                          "training part (placement partition)")
    return with_workload({**checked, AGGREGATION: aggregation}, given)


def _load_pair(spec: gan_models.GanSpec, weights: Mapping[str, np.ndarray],
               device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    g, d = gan_models.build_gan(spec)
    try:
        gan_models.numpy_to_state(g, weights, "G.")
        gan_models.numpy_to_state(d, weights, "D.")
    except ValueError as exc:
        raise ConfigError(f"weights do not fit {spec}: {exc}") from exc
    return g.to(device), d.to(device)


def train_slot(job: UnitJob, dataset_dir: Path, config: Mapping[str, Any], part: int = 0,
               parts: int = 1) -> UnitOutput | None:
    """E local epochs of alternating D/G steps on the slot's shard, from the global pair;
    with ``parts`` > 1, on share ``part`` of the shard (None when it holds no batch)."""
    slot, shard = _shard_of(job, dataset_dir, config)
    spec = gan_models.gan_spec(job.model, config["batchnorm"])
    g, d = _load_pair(spec, job.weights, job.device)
    g.train()
    d.train()
    opt_g, opt_d = adam(g.parameters(), config), adam(d.parameters(), config)
    b, seed, epochs = config["batch_size"], config["seed"], config["local_epochs"]
    shard = shard[slice(*part_bounds(len(shard), part, parts, b))]
    per_epoch = len(shard) // b
    if per_epoch == 0 and parts > 1:  # a share too small for one batch
        return None
    losses, wrong = [], 0
    for local in range(epochs * per_epoch):
        job.control.step()
        step = (job.round - 1) * epochs * per_epoch + local  # the slot's batch number
        real = real_batch(dataset_dir, batch_indices(shard, b, step, seed, slot))
        z = noise(spec.z_dim, b, seed, slot, step, *([part] if parts > 1 else []))
        loss, batch_wrong = alternating_step(g, d, opt_g, opt_d, real.to(job.device),
                                             z.to(job.device))
        losses.append(loss)
        wrong += batch_wrong
    update = {**gan_models.state_to_numpy(g, "G."), **gan_models.state_to_numpy(d, "D.")}
    return UnitOutput(update=update, num_samples=len(shard), loss=float(np.mean(losses)),
                      error=wrong / (2 * b * len(losses)))


def _shard_of(job: UnitJob, dataset_dir: Path,
              config: Mapping[str, Any]) -> tuple[int, np.ndarray]:
    """The unit's slot (seeds its batches and noise) and its training-part indices: the
    slot's iid shard, or its client's part (the client's index stands for the slot)."""
    if job.unit.client is None:
        slot = slot_of(job.unit.unit_id, config["workers"])
        return slot, shard_indices(training_size(dataset_dir), slot, config["workers"],
                                   config["seed"])
    settings = clients_settings(config.get(CLIENTS))
    index = client_index(job.unit.client, settings.count)
    return index, client_parts(dataset_dir, settings, config["seed"])[0][index]


class FLGan(AveragingAlgorithm):
    """See the module docstring."""

    name = "fl_gan"
    Config = FlGanSettings  # its keys, types and defaults (training/schema.py)
    models = MODELS
    splits_units = True
    clients = True  # each unit may be one federated client's local GAN

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """No topk: an update is a whole model state, not a delta that adds up."""
        return {"up": frozenset({"fp16", "int8"}), "down": frozenset({"fp16"})}

    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        return _check_config(model, config)

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        return train_slot(job, dataset_dir, cls.unit_config(job))

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """Local training on a share of the slot's shard; the node averages the shares'
        states (local averaging, not one sequential training of the shard)."""
        config = cls.unit_config(job)
        return train_slot(job, dataset_dir, config, part, parts)

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        super().__init__(model, config, dataset_dir, dataset)
        self.roster = self._roster(clients_settings(self.config.get(CLIENTS)))
        if self.roster is None:
            check_round_size(self.config[AGGREGATION], self.config["workers"])  # one state a slot
            check_shards(dataset_dir, self.config["workers"], self.config["batch_size"])
        self.spec = gan_models.gan_spec(model, self.config["batchnorm"])
        self.g, self.d = gan_models.build_gan(self.spec, seed=self.config["seed"])
        self.g.eval()
        self.d.eval()
        self.probe = mnist.to_model_input(mnist.held_out_part(dataset_dir)[0][:PROBE_SIZE])
        self.probe_z = noise(self.spec.z_dim, PROBE_SIZE, PROBE_SEED)

    def _roster(self, settings: ClientsSettings) -> ClientRoster | None:
        """A run with clients: the MNIST training part dealt to them, each holding at least
        one batch, and every round's (combined) states enough for the rule."""
        if not settings.enabled:
            return None
        parts, record = client_parts(self.dataset_dir, settings, self.config["seed"])
        roster = ClientRoster(settings, self.config["seed"], mnist.IMAGES_FILE)
        roster.deal(parts, record)
        check_client_sizes(roster.sizes, self.config["batch_size"])
        check_round_size(self.config[AGGREGATION], min(roster.target(), roster.count))
        return roster

    @property
    def partition(self) -> PartitionRecord | None:
        return None if self.roster is None else self.roster.record

    def initial_weights(self) -> Weights:
        return {**gan_models.state_to_numpy(self.g, "G."),
                **gan_models.state_to_numpy(self.d, "D.")}

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        if self.roster is not None:
            return self.roster.round_units(round_index)
        return [UnitSpec(slot_unit_id(UNIT_TAG, round_index, slot), mnist.IMAGES_FILE)
                for slot in range(self.config["workers"])]

    def quorum(self, num_units: int) -> int:
        """Every unit; with over-selected clients, the round's target count."""
        if self.roster is not None:
            return min(num_units, self.roster.target())
        return num_units

    def unit_samples(self, unit: UnitSpec) -> int | None:
        """The images of the unit's shard (np.array_split: the first shards get one more),
        or of its client."""
        if self.roster is not None:
            return self.roster.examples(unit)
        workers = self.config["workers"]
        size = training_size(self.dataset_dir)
        return size // workers + (slot_of(unit.unit_id, workers) < size % workers)

    def expected_update(self, weights: Weights) -> TensorSpecs:
        """A node returns the whole state: the weights' tensors, shapes and dtypes."""
        return specs_of(weights)

    def apply(self, weights: Weights, combined: Weights) -> Weights:
        """The combined state of the nodes is the next global model, in the tensors and
        dtypes of the current one (``weights``)."""
        if sorted(combined) != sorted(weights):
            missing = sorted(set(weights) - set(combined))[:3]
            raise ValueError(f"averaged state does not match the model: missing {missing}, "
                             f"unexpected {sorted(set(combined) - set(weights))[:3]}")
        self._load(combined)
        return self.initial_weights()

    def _load(self, weights: Mapping[str, np.ndarray]) -> None:
        gan_models.numpy_to_state(self.g, weights, "G.")
        gan_models.numpy_to_state(self.d, weights, "D.")

    @torch.no_grad()
    def evaluate(self, weights: Weights) -> RoundEval:
        self._load(weights)
        loss, wrong = d_loss(self.d, self.probe, self.g(self.probe_z))
        return RoundEval(validation_error=wrong / (2 * PROBE_SIZE), validation_loss=float(loss))

    def epochs_done(self, round_index: int) -> float | None:
        """Passes of every shard; with clients none is counted (a round trains only its
        sampled clients)."""
        if self.roster is not None:
            return None
        return float(round_index * self.config["local_epochs"])

    def model_description(self) -> dict[str, Any]:
        return {"model": self.model, "gan": self.spec.to_dict()}

    def sample_images(self, weights: Weights, n: int, seed: int = 0) -> np.ndarray:
        self._load(weights)
        return gan_models.sample_images(self.g, n, seed).numpy()

    def score(self, weights: Weights, n: int) -> dict[str, float]:
        self._load(weights)
        images = gan_models.sample_images(self.g, n, seed=gan_metrics.SCORE_SEED)
        return gan_metrics.score_images(images, n, root=self.dataset_dir).to_dict()
