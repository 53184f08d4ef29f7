"""GAN training pieces shared by FL-GAN, MD-GAN and the standalone baseline.

* **Worker slots and iid shards.** A run with N worker slots cuts the MNIST training part
  (8,000 images) into N iid shards: slot i takes part i of a permutation of the training
  indices seeded by (seed, N). The shard depends on the slot, never on the node that
  happens to run it, so a node that takes a slot over (after a crash, say) trains on the
  same images.
* **Real batches.** A slot walks its shard in epochs of ``len(shard) // b`` batches (the
  last partial batch is dropped), each epoch in a fresh order seeded by (seed, slot,
  epoch); batch number t is therefore a function of (slot, t) alone.
* **Losses.** Non-saturating GAN losses with logits: D minimises BCE(D(x), 1) +
  BCE(D(G(z)), 0), G minimises BCE(D(G(z)), 1).
* **Unit ids** of slot-based algorithms read ``<tag><round>-slot<i>``; the node half
  recovers the slot from it, so no extra field has to travel.
* **Federated clients** (training/clients/) take the shards' place: client k's part of
  the training part, dealt by the run's partitioner from the MNIST labels
  (`client_parts`), the same on every process; k stands for the slot in the seeds.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.data_parts import label_parts
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.data import mnist
from thrift_trainer.training.data.paths import files_stamp

_SLOT_UNIT = re.compile(r"^[a-z]+(\d+)-slot(\d+)$")
# The fixed probe of a GAN's cheap per-round evaluation: real and fake images, and the
# seed of the fakes' noise.
PROBE_SIZE, PROBE_SEED = 64, 12345


# ------------------------------------------------------------------ configuration


def check_positive(config: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    """Every named key must be a positive number (ints and floats alike)."""
    for key in keys:
        value = config[key]
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"config key {key!r} must be positive, got {value!r}")


def check_adam(config: Mapping[str, Any]) -> None:
    """The Adam settings and the seed every GAN algorithm shares."""
    check_positive(config, ("lr",))
    for key in ("beta1", "beta2"):
        if not 0.0 <= config[key] < 1.0:
            raise ConfigError(f"config key {key!r} must be in [0, 1), got {config[key]}")
    if not 0 <= config["seed"] < 2**31:
        raise ConfigError(f"config key 'seed' must be in [0, 2**31), got {config['seed']}")


def adam(params: Any, config: Mapping[str, Any]) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=config["lr"], betas=(config["beta1"], config["beta2"]))


# ------------------------------------------------------------------ slots and shards


def slot_unit_id(tag: str, round_index: int, slot: int) -> str:
    return f"{tag}{round_index}-slot{slot}"


def slot_of(unit_id: str, workers: int) -> int:
    """The worker slot a unit id names; ConfigError if it names none of the N slots."""
    match = _SLOT_UNIT.match(unit_id)
    if match is None or not 0 <= int(match.group(2)) < workers:
        raise ConfigError(f"unit id {unit_id!r} names no worker slot of 0..{workers - 1}")
    return int(match.group(2))


def training_size(folder: Path) -> int:
    return len(training_images(folder))


def check_shards(folder: Path, workers: int, batch_size: int) -> int:
    """The smallest shard's batches per local epoch; ConfigError when a shard holds less
    than one batch (too many workers for the data set)."""
    try:
        size = training_size(folder)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data set {folder} cannot serve MNIST GANs: {exc}") from exc
    smallest = size // workers
    if smallest < batch_size:
        raise ConfigError(f"{workers} workers leave shards of {smallest} images, fewer than "
                          f"batch_size {batch_size}; use fewer workers or a smaller batch")
    return smallest // batch_size


def client_parts(folder: Path, settings: ClientsSettings,
                 seed: int) -> tuple[list[np.ndarray], PartitionRecord]:
    """The run's clients' parts of the MNIST training part and their record; ConfigError
    when the folder holds no MNIST or the partitioner cannot deal it."""
    try:
        size = training_size(folder)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data set {folder} cannot serve MNIST GANs: {exc}") from exc
    return label_parts(("mnist", str(folder.resolve()), size),
                       lambda: mnist.training_part(folder)[1].astype(np.int64), settings, seed)


def check_client_sizes(sizes: Mapping[str, int], batch_size: int,
                       empty_ok: bool = True) -> None:
    """ConfigError when a client holds less than one batch (an empty one too, unless
    ``empty_ok``: such a client is never asked)."""
    small = {name: size for name, size in sizes.items()
             if size < batch_size and (size > 0 or not empty_ok)}
    if small:
        name = min(small, key=small.__getitem__)
        raise ConfigError(f"clients: {name} holds {small[name]} images, fewer than "
                          f"batch_size {batch_size} ({len(small)} such clients); use fewer "
                          f"clients, another partition or a smaller batch")


def shard_indices(size: int, slot: int, workers: int, seed: int) -> np.ndarray:
    """Indices into the training part of slot ``slot``'s iid shard."""
    order = np.random.default_rng([seed, workers]).permutation(size)
    return np.array_split(order, workers)[slot]


def batch_indices(shard: np.ndarray, batch_size: int, step: int, seed: int,
                  slot: int) -> np.ndarray:
    """Training-part indices of the slot's ``step``-th real batch (0-based)."""
    per_epoch = len(shard) // batch_size
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, slot, epoch, 1]).permutation(len(shard))
    return shard[order[position * batch_size:(position + 1) * batch_size]]


def real_batch(folder: Path, indices: np.ndarray) -> torch.Tensor:
    """Training-part images at ``indices`` as (n, 1, 28, 28) float32 in [-1, 1]."""
    return mnist.to_model_input(training_images(folder)[indices])


def training_images(folder: Path) -> np.ndarray:
    """The MNIST training part's images, read again once either file changed."""
    folder = folder.resolve()
    stamp = files_stamp(folder / mnist.IMAGES_FILE, folder / mnist.LABELS_FILE)
    return _training_images(str(folder), stamp)


@functools.lru_cache(maxsize=4)
def _training_images(folder: str, stamp: tuple) -> np.ndarray:
    return mnist.training_part(folder)[0]


def noise(z_dim: int, n: int, *key: int) -> torch.Tensor:
    """Gaussian noise (n, z_dim) from a seed made of ``key`` (e.g. seed, round, batch)."""
    generator = torch.Generator().manual_seed(
        int(np.random.SeedSequence(list(key)).generate_state(1)[0]))
    return torch.randn(n, z_dim, generator=generator)


# ------------------------------------------------------------------ losses and steps


def d_loss(d: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, int]:
    """D's loss on a real and a fake batch, and how many of them it misclassifies."""
    real_logits, fake_logits = d(real), d(fake)
    loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
            + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))
    wrong = int((real_logits <= 0).sum()) + int((fake_logits > 0).sum())
    return loss, wrong


def g_loss(logits: torch.Tensor) -> torch.Tensor:
    """The non-saturating generator loss on D's logits for generated images."""
    return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


def d_step(d: nn.Module, optimizer: torch.optim.Optimizer, real: torch.Tensor,
           fake: torch.Tensor) -> tuple[float, int]:
    """One Adam step of D on (real, fake); fake must not carry G's graph."""
    optimizer.zero_grad(set_to_none=True)
    loss, wrong = d_loss(d, real, fake)
    loss.backward()
    optimizer.step()
    return float(loss.detach()), wrong


def alternating_step(g: nn.Module, d: nn.Module, opt_g: torch.optim.Optimizer,
                     opt_d: torch.optim.Optimizer, real: torch.Tensor,
                     z: torch.Tensor) -> tuple[float, int]:
    """The usual DCGAN iteration: a D step on (real, G(z)), then a G step against the
    updated D on the same fakes. Returns D's loss and its misclassified count."""
    fake = g(z)
    loss, wrong = d_step(d, opt_d, real, fake.detach())
    opt_g.zero_grad(set_to_none=True)
    g_loss(d(fake)).backward()
    opt_g.step()
    return loss, wrong
