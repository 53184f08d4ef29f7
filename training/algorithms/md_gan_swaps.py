"""MD-GAN's discriminator swaps (step 4 of an iteration, training/algorithms/md_gan.py).

``after_round``: every E = ``swap_every_epochs`` local epochs (a local epoch is
len(shard) // b iterations), the slots swap discriminators along a seeded random
derangement (nobody keeps its own, nobody gets two; no swap when N = 1): the node
holding D_i sends it to the node holding slot perm[i], node to node, or relayed
through the coordinator when an end cannot accept connections
(engine/session_moves.py). Parameters and buffers move, and by default (key
``swap_optimizer``) Adam's moments and step count too: they describe the trajectory
of that D, and a D arriving with fresh moments would take its first steps at a full
lr whatever its gradients; the logs count both payloads separately. A move is staged
under the swap's id and installed by the first unit that carries that id, so a swap
never mixes with an iteration in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from thrift_trainer.training.algorithms.md_gan_node import Discriminator, session_name
from thrift_trainer.training.gan_training import slot_of
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.units import SessionMoved, SessionMoveError, SessionMoves

log = logging.getLogger("training.md_gan")

DERANGEMENT_TRIES = 200


def derangement(n: int, rng: np.random.Generator) -> list[int]:
    """A random permutation without fixed points (slot i's D goes to slot perm[i]).

    Uniform over derangements by rejection (a try succeeds with probability ~1/e); after
    DERANGEMENT_TRIES misses (odds below 1e-39) a random n-cycle (Sattolo) is used.
    """
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 elements, got {n}")
    for _ in range(DERANGEMENT_TRIES):
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return [int(i) for i in perm]
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = int(rng.integers(0, i))
        perm[i], perm[j] = perm[j], perm[i]
    return perm



@dataclass
class SwapStats:
    """Totals over the run's swaps; model and optimizer bytes are counted apart."""

    swaps: int = 0
    moved: int = 0
    relayed: int = 0
    failed: int = 0
    model_bytes: int = 0
    optimizer_bytes: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)




class DiscriminatorSwaps:
    """The swap half of `MDGan`, which sets the attributes below in its ``__init__``."""

    config: Mapping[str, Any]
    workers: int
    swap_period: int  # iterations between swaps
    placement: dict[int, str]  # slot -> node holding its D
    swaps_done: int
    swap_stats: SwapStats
    model_bytes: int  # of one D's parameters and buffers, as a swap sends them
    optimizer_bytes: int  # of one D's Adam state (0 when it does not move)

    def after_round(self, round_index: int, sessions: SessionMoves) -> None:
        """Note where each slot's D now lives; swap the discriminators when due."""
        for unit_id, node in sessions.placement.items():
            self.placement[slot_of(unit_id, self.workers)] = node
        if self.config["swap"] and self.workers > 1 and round_index % self.swap_period == 0:
            self.swap(sessions)

    def swap(self, sessions: SessionMoves) -> list[int]:
        """Move D_i to slot perm[i] for a fresh derangement; returns the permutation."""
        swap_id = self.swaps_done + 1
        perm = derangement(self.workers, np.random.default_rng([self.config["seed"], swap_id]))
        moved = relayed = failed = 0
        for source, target in enumerate(perm):
            try:
                result = self._move(sessions, source, target, swap_id)
            except SessionMoveError as exc:
                log.warning("swap %d: D of slot %d stays behind: %s", swap_id, source, exc)
                failed += 1
                continue
            moved += 1
            relayed += result.relayed
        self.swaps_done = swap_id
        self._record_swap(swap_id, perm, moved, relayed, failed)
        return perm

    def _move(self, sessions: SessionMoves, source: int, target: int,
              swap_id: int) -> SessionMoved:
        if source not in self.placement or target not in self.placement:
            raise SessionMoveError(f"slot {source if source not in self.placement else target}"
                                   " has not run on any node yet")
        result = sessions.move(self.placement[source], session_name(source),
                               self.placement[target], session_name(target), swap_id)
        if result.bytes != self.model_bytes + self.optimizer_bytes:
            log.warning("swap %d: slot %d moved %d bytes, expected %d", swap_id, source,
                        result.bytes, self.model_bytes + self.optimizer_bytes)
        return result

    def _record_swap(self, swap_id: int, perm: list[int], moved: int, relayed: int,
                     failed: int) -> None:
        s = self.swap_stats
        s.swaps += 1
        s.moved += moved
        s.relayed += relayed
        s.failed += failed
        s.model_bytes += moved * self.model_bytes
        s.optimizer_bytes += moved * self.optimizer_bytes
        s.log.append({"swap": swap_id, "perm": perm, "moved": moved, "relayed": relayed,
                      "failed": failed})
        log.info("swap %d: %d discriminators moved (%d relayed, %d failed); %d B of "
                 "parameters and buffers + %d B of Adam state", swap_id, moved, relayed,
                 failed, moved * self.model_bytes, moved * self.optimizer_bytes)


def session_sizes(spec: gan_models.GanSpec, config: Mapping[str, Any]) -> tuple[int, int]:
    """Bytes of a D's parameters and buffers, and of its Adam state, as a swap sends them."""
    d = Discriminator(spec, config, 0).d
    model = sum(a.nbytes for a in gan_models.state_to_numpy(d).values())
    optimizer = sum(2 * 4 * p.numel() + 4 for p in d.parameters())
    return model, optimizer if config["swap_optimizer"] else 0
