"""MD-GAN's node half (training/algorithms/md_gan.py): a worker slot's discriminator D_n
and its Adam, kept in a node session between iterations, and one unit's work on it: L
Adam steps of D_n on (the slot's next real batch, X_d), then the feedback F_n = d loss_G /
d X_g through D_n.

Sessions and placement. A slot's D lives where its last unit ran: each unit names that
node as its preferred one (``UnitSpec.preferred_node``), and since training a unit changes
its session, a unit never runs twice at once (``allows_backups = False``). A node that gets
a unit for a slot it holds no session for (the first iteration, or a node taking over from
one that crashed) creates that D from the seed, as the slot's D was at iteration 0; the
slot then follows the new node. A node refuses a unit for an iteration its session has
already trained (a late duplicate), so a D never trains twice on one iteration.

With federated clients (``clients.count`` = ``workers``), slot n's real batches come from
client n's part, and its units go only to nodes that hold client n: a swap moves the
discriminators between the clients' holders, never the data.

A session's tensors: D's parameters and buffers (``D.``) and, when the optimizer moves
with it (``swap_optimizer``), Adam's state (``adam.``), as a swap exports and imports them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.settings import SECTION as CLIENTS
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.gan_training import (
    adam,
    batch_indices,
    client_parts,
    d_step,
    g_loss,
    real_batch,
    shard_indices,
    training_size,
)
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.models.modules import float32_copy
from thrift_trainer.training.optimizer_state import (
    ADAM_KEYS,
    load_optimizer_arrays,
    optimizer_arrays,
)
from thrift_trainer.training.units import UnitJob, UnitOutput, Weights

log = logging.getLogger("training.md_gan")

X_G, X_D, SWAP_ID = "x_g", "x_d", "swap_id"  # a unit's tensors
FEEDBACK, ITERATION, D_STATS = "feedback", "iteration", "d_stats"  # a unit's update
ADAM = "adam."  # prefix of the optimizer state in a session's tensors


def session_name(slot: int) -> str:
    return f"d{slot}"


class Discriminator:
    """A slot's D and its Adam: the state of a node session."""

    def __init__(self, spec: gan_models.GanSpec, config: Mapping[str, Any], slot: int,
                 device: str = "cpu") -> None:
        # Each slot's D starts from its own seed, the same on every node.
        _, d = gan_models.build_gan(spec, seed=config["seed"] + 1000 * (slot + 1))
        self.d = d.to(device)
        self.config = dict(config)
        self.optimizer = adam(self.d.parameters(), config)

    def export(self) -> Weights:
        """Parameters and buffers (``D.``), plus Adam's state (``adam.``) when it moves."""
        state = gan_models.state_to_numpy(self.d, "D.")
        if self.config["swap_optimizer"]:
            state.update(optimizer_arrays(dict(self.d.named_parameters()), self.optimizer,
                                          ADAM))
        return state

    def load(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Install an imported state; without Adam state the optimizer starts afresh."""
        gan_models.numpy_to_state(self.d, tensors, "D.")
        self.optimizer = adam(self.d.parameters(), self.config)
        load_optimizer_arrays(dict(self.d.named_parameters()), self.optimizer, tensors, ADAM,
                              ADAM_KEYS)

    def feedback(self, x_g: torch.Tensor) -> np.ndarray:
        """F = d loss_G / d X_g through this D."""
        x = x_g.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(g_loss(self.d(x)), x)
        return float32_copy(grad)


def _unit_inputs(tensors: Mapping[str, np.ndarray], spec: gan_models.GanSpec, batch_size: int,
                 device: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    if sorted(tensors) != sorted((X_G, X_D, SWAP_ID)):
        raise ConfigError(f"an md_gan unit carries {X_G}, {X_D} and {SWAP_ID}, "
                          f"got {sorted(tensors)[:5]}")
    shape = (batch_size, *spec.image_shape)
    for name in (X_G, X_D):
        if tensors[name].shape != shape:
            raise ConfigError(f"{name} has shape {tensors[name].shape}, expected {shape}")
    x_g, x_d = (torch.from_numpy(np.asarray(tensors[n], np.float32)).to(device)
                for n in (X_G, X_D))
    return x_g, x_d, int(np.asarray(tensors[SWAP_ID]).reshape(-1)[0])


def _session_discriminator(session: Any, spec: gan_models.GanSpec, config: Mapping[str, Any],
                           slot: int, swap_id: int, device: str) -> Discriminator:
    """The slot's D, created from the seed if this node holds none, with any import
    staged for this swap id (or an earlier one) installed first."""
    staged = session.take_staged(swap_id)
    if session.state is None:
        log.info("slot %d: no discriminator on this node; starting one from the seed", slot)
        session.state = Discriminator(spec, config, slot, device)
    if staged is not None:
        session.state.load(staged)
    return session.state


def _real(dataset_dir: Path, config: Mapping[str, Any], slot: int,
          iteration: int) -> torch.Tensor:
    """The slot's real batch of this iteration (one per iteration, as in Algorithm 1),
    from its shard or, with federated clients, from client ``slot``'s part."""
    clients = clients_settings(config.get(CLIENTS))
    if clients.enabled:
        shard = client_parts(dataset_dir, clients, config["seed"])[0][slot]
    else:
        shard = shard_indices(training_size(dataset_dir), slot, config["workers"],
                              config["seed"])
    return real_batch(dataset_dir, batch_indices(shard, config["batch_size"], iteration - 1,
                                                 config["seed"], slot))


def train_slot(job: UnitJob, dataset_dir: Path, config: Mapping[str, Any], slot: int,
                spec: gan_models.GanSpec) -> UnitOutput:
    x_g, x_d, swap_id = _unit_inputs(job.weights, spec, config["batch_size"], job.device)
    name = session_name(slot)
    with job.sessions.use(job.run_id, name) as session:
        if job.round <= session.last_round:
            raise ConfigError(f"unit {job.unit.unit_id}: session {name} has already trained "
                              f"iteration {session.last_round}; a late duplicate is refused")
        disc = _session_discriminator(session, spec, config, slot, swap_id, job.device)
        real = _real(dataset_dir, config, slot, job.round).to(job.device)
        for _ in range(config["disc_steps"]):
            job.control.step()
            loss, wrong = d_step(disc.d, disc.optimizer, real, x_d)
        feedback = disc.feedback(x_g)
        session.last_round = job.round
    error = wrong / (2 * len(real))
    update = {FEEDBACK: feedback, ITERATION: np.array([job.round], np.int64),
              D_STATS: np.array([loss, error], np.float32)}
    return UnitOutput(update=update, num_samples=len(real), loss=loss, error=error)

