"""MD-GAN (Hardy, Le Merrer and Sericola, IPDPS 2019): one generator, N discriminators.

The generator G and its Adam live on the coordinator (this object); each of the N worker
slots (``workers``) keeps a discriminator D_n and its Adam in a **session** on the node
that runs the slot's units (compute_node/sessions.py). One round is one iteration of the
paper's Algorithm 1:

1. ``plan_round``: G, in training mode, generates k batches of b images from noise seeded
   by (seed, iteration, batch) and keeps their graphs. Slot n gets X_g = batch n mod k and
   X_d = batch (n + 1) mod k, the paper's split, sent as the unit's tensors
   (``unit_tensors``). With k = 1 both would be the same batch, so one extra batch is
   generated (without a graph: only the discriminators train on it) as every slot's X_d.
2. ``run_unit`` (node): L = ``disc_steps`` Adam steps of D_n on (the slot's next real
   batch, X_d), then the feedback F_n = d loss_G / d X_g through D_n (non-saturating loss,
   by ``torch.autograd.grad`` so D_n's gradients are untouched), returned as float32.
3. ``aggregate``: per batch, the mean of the feedbacks that came back for it (F_n / count);
   the batches are then averaged (a further 1/k), which keeps the gradient's scale that
   of one G step on b images whatever k is. When k divides N and every feedback is in,
   every batch has N/k of them and this is the paper's dw = 1/(Nb) sum_n sum_i e_ni
   dx_i/dw = 1/N sum_n d loss_n / dw; a lost feedback does not tilt the step towards the
   batches that kept theirs. ONE ``torch.autograd.backward`` through the kept graphs, then
   one Adam step of G.
4. ``after_round``: every E = ``swap_every_epochs`` local epochs the slots swap
   discriminators along a seeded random derangement (training/algorithms/md_gan_swaps.py).

A slot's D lives in a session on the node where its last unit ran, and its units prefer
that node (training/algorithms/md_gan_node.py).

Stale feedback. The engine drops results that arrive after their round; besides, each
feedback carries its iteration, and ``aggregate`` ignores any that is not the current one.

Data. Slot n trains on the n-th iid shard of the MNIST training part (training/
gan_training.py), in a fixed order per (slot, epoch), so a node that takes a slot over
reads the same images. The paper used an ACGAN (conditional); this is an unconditional
DCGAN.

Federated clients (``clients``, placement partition): the MNIST training part is dealt to
the clients by the run's partitioner, one client per slot (``clients.count`` must equal
``workers``, and every client takes part in every iteration, as every slot does). Slot n
reads client n's images, and its units go only to nodes that hold client n
(``compute_node.py --clients``); a swap moves discriminators between those nodes, never
images. A local epoch (the swap period's unit) is the smallest client's batches.

Per-round evaluation (cheap, a progress signal only): the mean error rate and loss of the
workers' discriminators on their last real and X_d batches. IS and FID come from
``score``, as for sync_sgd's GANs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import (
    ConfigError,
    checked_settings,
    split_aggregation,
)
from thrift_trainer.training.algorithms.md_gan_node import (
    D_STATS,
    FEEDBACK,
    ITERATION,
    SWAP_ID,
    X_D,
    X_G,
    train_slot,
)
from thrift_trainer.training.algorithms.md_gan_swaps import (
    DiscriminatorSwaps,
    SwapStats,
    session_sizes,
)
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.settings import SECTION as CLIENTS
from thrift_trainer.training.clients.settings import client_name
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.data.mnist import IMAGES_FILE
from thrift_trainer.training.gan_training import (
    adam,
    check_adam,
    check_client_sizes,
    check_positive,
    check_shards,
    client_parts,
    noise,
    slot_of,
    slot_unit_id,
    training_size,
)
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.models.modules import float32_copy
from thrift_trainer.training.optimizer_state import (
    ADAM_KEYS,
    load_optimizer_arrays,
    optimizer_arrays,
)
from thrift_trainer.training.outputs import gan_metrics
from thrift_trainer.training.schema import MdGanSettings, defaults
from thrift_trainer.training.units import (
    RoundEval,
    UnitFailure,
    UnitJob,
    UnitOutput,
    UnitResult,
    UnitSpec,
    Weights,
)

log = logging.getLogger("training.md_gan")

MODELS = tuple(name for name in gan_models.GAN_MODELS if gan_models.is_mnist_model(name))
UNIT_TAG = "md"
OPTIM_G = "optim.G.adam."  # prefix of G's Adam state in a checkpoint
MAX_SWAP_EPOCHS = 1e9


def resolve_k(k: int | str, workers: int) -> int:
    """Batches generated per iteration: k, or floor(log2 N) (at least 1) for "log2"."""
    return max(1, int(math.floor(math.log2(workers)))) if k == "log2" else int(k)


def _check_config(model: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if model not in MODELS:
        raise ConfigError(f"algorithm 'md_gan' trains models {MODELS}, not {model!r}")
    raw, (config, aggregation) = config, split_aggregation(config)
    if aggregation["rule"] != "mean":  # its units' updates are kept apart, never averaged
        raise ConfigError(f"config key 'aggregation.rule' must be 'mean' for md_gan (its "
                          f"feedback is not averaged), got {aggregation['rule']!r}")
    known = defaults(MdGanSettings)
    checked = checked_settings(config, known, "md_gan", free=("k",))
    checked["k"] = _check_k(checked["k"])
    check_positive(checked, ("workers", "batch_size", "disc_steps", "swap_every_epochs"))
    if checked["swap_every_epochs"] > MAX_SWAP_EPOCHS:  # its period in iterations must fit an int
        raise ConfigError(f"config key 'swap_every_epochs' must be at most {MAX_SWAP_EPOCHS:g} "
                          f"(false 'swap' turns swaps off), got {checked['swap_every_epochs']}")
    check_adam(checked)
    if resolve_k(checked["k"], checked["workers"]) > checked["workers"]:
        raise ConfigError(f"config key 'k' ({checked['k']}) must be at most 'workers' "
                          f"({checked['workers']}): each batch needs a discriminator")
    clients = _checked_clients(raw.get(CLIENTS), checked["workers"])
    return {**{key: checked[key] for key in known}, **clients}


def _checked_clients(raw: Any, workers: Any) -> dict[str, Any]:
    """The ``clients`` section as the checked config carries it ({} without clients);
    ConfigError, in one line, for clients MD-GAN's slots cannot take."""
    settings = clients_settings(raw)
    if not settings.enabled:
        return {}
    if settings.on_nodes:
        problem = ("md_gan's clients are parts of the MNIST training part, one per "
                   "discriminator slot (placement partition)")
    elif settings.count != workers:
        problem = (f"md_gan gives each discriminator slot one client's data: clients.count "
                   f"({settings.count}) must equal md_gan.workers ({workers})")
    elif settings.per_round not in (0, settings.count) or settings.over_select != 1:
        problem = ("md_gan trains every slot's discriminator each iteration: leave "
                   "clients.per_round at 0 (every client) and clients.over_select at 1")
    else:
        return {CLIENTS: settings.to_dict()}
    raise ConfigError(f"clients: {problem}")


def _check_k(value: Any) -> int | str:
    if value == "log2" or (isinstance(value, int) and not isinstance(value, bool)
                           and value >= 1):
        return value
    raise ConfigError(f"config key 'k' must be an integer >= 1 or \"log2\", got {value!r}")


# ------------------------------------------------------------------ coordinator half


@dataclass
class _Iteration:
    """What plan_round generated for one iteration, kept until aggregate."""

    round: int
    swap_id: int
    k: int
    batches: list[torch.Tensor]  # the k batches with G's graph
    images: list[np.ndarray]  # every batch sent (k, or k + 1 when k = 1), float32
    units: list[UnitSpec]

    def g_batch(self, slot: int) -> int:
        return slot % self.k

    def d_batch(self, slot: int) -> int:
        return (slot + 1) % self.k if self.k > 1 else 1


class MDGan(DiscriminatorSwaps, Algorithm):
    """See the module docstring."""

    name = "md_gan"
    Config = MdGanSettings  # its keys, types and defaults (training/schema.py)
    models = MODELS
    uses_sessions = True
    allows_backups = False
    clients = True  # one client per discriminator slot (see the module docstring)

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """None: units carry generated batches, not the weights, and the feedback is
        applied per batch in one generator step."""
        return {"up": frozenset(), "down": frozenset()}

    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config with defaults filled in; ``k`` may be an int or "log2"."""
        return _check_config(model, config)

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        config = cls.unit_config(job)
        if job.sessions is None:
            raise ConfigError("md_gan keeps each discriminator in a node session; "
                              "this node offers none")
        slot = slot_of(job.unit.unit_id, config["workers"])
        spec = gan_models.gan_spec(job.model, config["batchnorm"])
        return train_slot(job, dataset_dir, config, slot, spec)

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        super().__init__(model, config, dataset_dir, dataset)
        c = self.config
        self.workers = c["workers"]
        self.k = resolve_k(c["k"], self.workers)
        self.client_settings = clients_settings(c.get(CLIENTS))
        self.client_record: PartitionRecord | None = None
        self.epoch_iterations = self._client_epoch() if self.client_settings.enabled else \
            check_shards(dataset_dir, self.workers, c["batch_size"])
        self.swap_period = max(1, round(c["swap_every_epochs"] * self.epoch_iterations))
        self.spec = gan_models.gan_spec(model, c["batchnorm"])
        self.g, _ = gan_models.build_gan(self.spec, seed=c["seed"])
        self.opt_g = adam(self.g.parameters(), c)
        self.placement: dict[int, str] = {}  # slot -> node holding its D
        self.swaps_done = 0
        self.swap_stats = SwapStats()
        self.model_bytes, self.optimizer_bytes = session_sizes(self.spec, c)
        self._iteration: _Iteration | None = None
        self._last = RoundEval(validation_error=math.nan, validation_loss=math.nan)

    def _client_epoch(self) -> int:
        """With clients: the smallest client's batches (each must hold one); the
        partition is kept for the run folder."""
        parts, self.client_record = client_parts(self.dataset_dir, self.client_settings,
                                                 self.config["seed"])
        sizes = {name: len(part) for name, part in zip(self.client_settings.names(), parts,
                                                       strict=True)}
        check_client_sizes(sizes, self.config["batch_size"], empty_ok=False)
        return min(sizes.values()) // self.config["batch_size"]

    @property
    def partition(self) -> PartitionRecord | None:
        return self.client_record

    def initial_weights(self) -> Weights:
        return gan_models.state_to_numpy(self.g, "G.")

    def units_per_round(self) -> int:
        """A unit per worker slot, known without generating an iteration."""
        return self.workers

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        """Generate the iteration's batches (once: asking again returns the same plan)."""
        if self._iteration is None or self._iteration.round != round_index:
            self._iteration = self._generate(round_index)
        return self._iteration.units

    def _generate(self, round_index: int) -> _Iteration:
        b, z_dim, seed = self.config["batch_size"], self.spec.z_dim, self.config["seed"]
        self.g.train()
        batches = [self.g(noise(z_dim, b, seed, round_index, j)) for j in range(self.k)]
        images = [float32_copy(x) for x in batches]
        if self.k == 1:
            with torch.no_grad():
                images.append(float32_copy(self.g(noise(z_dim, b, seed, round_index, 1))))
        units = [UnitSpec(slot_unit_id(UNIT_TAG, round_index, slot), IMAGES_FILE,
                          preferred_node=self.placement.get(slot),
                          client=client_name(slot) if self.client_settings.enabled else None)
                 for slot in range(self.workers)]
        return _Iteration(round_index, self.swaps_done, self.k, batches, images, units)

    def unit_tensors(self, unit: UnitSpec) -> Weights:
        it = self._current()
        slot = slot_of(unit.unit_id, self.workers)
        return {X_G: it.images[it.g_batch(slot)], X_D: it.images[it.d_batch(slot)],
                SWAP_ID: np.array([it.swap_id], np.int64)}

    def _current(self) -> _Iteration:
        if self._iteration is None:
            raise RuntimeError("md_gan: no iteration planned")
        return self._iteration

    def unit_samples(self, unit: UnitSpec) -> int:
        """A unit trains on one real batch."""
        return self.config["batch_size"]

    def check_update(self, update: Weights, weights: Weights) -> None:
        super().check_update(update, weights)
        if sorted(update) != sorted((FEEDBACK, ITERATION, D_STATS)):
            raise ValueError(f"an md_gan update holds {FEEDBACK}, {ITERATION} and {D_STATS}, "
                             f"got {sorted(update)[:5]}")
        shape = (self.config["batch_size"], *self.spec.image_shape)
        if update[FEEDBACK].shape != shape:
            raise ValueError(f"feedback of shape {update[FEEDBACK].shape}, expected {shape}")

    def aggregate(self, round_index: int, weights: Weights, results: Sequence[UnitResult],
                  failures: Sequence[UnitFailure]) -> Weights:
        """One Adam step of G from the iteration's feedback, each unit's for the batch it
        was generated for (G lives here; the weights returned are its new state, which
        ``weights`` was before). Failed units' batches get no feedback this iteration."""
        it = self._current()
        sums, counts, stats = self._collect(it, {r.unit.unit_id: r.update for r in results})
        used = sorted(sums)
        grads = [torch.from_numpy((sums[j] / counts[j] / len(used)).astype(np.float32))
                 for j in used]
        self.opt_g.zero_grad(set_to_none=True)
        torch.autograd.backward([it.batches[j] for j in used], grad_tensors=grads)
        self.opt_g.step()
        self._iteration = None  # frees the graphs
        mean = np.mean(stats, axis=0)
        self._last = RoundEval(validation_error=float(mean[1]), validation_loss=float(mean[0]))
        return self.initial_weights()

    def _collect(self, it: _Iteration, updates: Mapping[str, Weights]
                 ) -> tuple[dict[int, np.ndarray], dict[int, int], list[np.ndarray]]:
        """Feedback summed per generated batch (float64), counts, and D statistics; feedback
        of another iteration, or for a unit not planned, is dropped."""
        planned = {unit.unit_id for unit in it.units}
        sums: dict[int, np.ndarray] = {}
        counts: dict[int, int] = {}
        stats = []
        for unit_id, update in updates.items():
            tag = int(np.asarray(update[ITERATION]).reshape(-1)[0])
            if unit_id not in planned or tag != it.round:
                log.warning("dropping feedback of %s (iteration %d) in iteration %d",
                            unit_id, tag, it.round)
                continue
            j = it.g_batch(slot_of(unit_id, self.workers))
            sums[j] = sums.get(j, 0.0) + np.asarray(update[FEEDBACK], np.float64)
            counts[j] = counts.get(j, 0) + 1
            stats.append(np.asarray(update[D_STATS], np.float64))
        if not sums:
            raise ValueError(f"no feedback of iteration {it.round} to apply")
        return sums, counts, stats

    def quorum(self, num_units: int) -> int:
        return num_units

    def evaluate(self, weights: Weights) -> RoundEval:
        return self._last

    def epochs_done(self, round_index: int) -> float:
        """Real images the discriminators have read, in passes over the training part."""
        return round_index * self.workers * self.config["batch_size"] / training_size(
            self.dataset_dir)

    def model_description(self) -> dict[str, Any]:
        return {"model": self.model, "gan": self.spec.to_dict()}

    def sample_images(self, weights: Weights, n: int, seed: int = 0) -> np.ndarray:
        return gan_models.sample_images(self.g, n, seed).numpy()

    def score(self, weights: Weights, n: int) -> dict[str, float]:
        images = gan_models.sample_images(self.g, n, seed=gan_metrics.SCORE_SEED)
        return gan_metrics.score_images(images, n, root=self.dataset_dir).to_dict()

    def state_dict(self) -> dict[str, np.ndarray]:
        """G's weights and Adam state and the swap count, so a resumed run goes on."""
        return {**gan_models.state_to_numpy(self.g, "generator."),
                **optimizer_arrays(dict(self.g.named_parameters()), self.opt_g, OPTIM_G),
                "swaps_done": np.array(self.swaps_done, np.int64)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        gan_models.numpy_to_state(self.g, state, "generator.")
        load_optimizer_arrays(dict(self.g.named_parameters()), self.opt_g, state, OPTIM_G,
                              ADAM_KEYS)
        self.swaps_done = int(state["swaps_done"])
        self._iteration = None
