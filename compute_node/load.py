"""Simulated load on a compute node, with the assignment's semantics.

Policy 1 (random scheduling): a node never rejects; with probability load_prob it
waits the load delay before working. Policy 2 (load balancing) and policy 3
(adaptive): a node rejects at once with probability load_prob, and an accepted unit
is still delayed with probability load_prob.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

POLICY_RANDOM = 1
POLICY_LOAD_BALANCING = 2
POLICY_ADAPTIVE = 3
KNOWN_POLICIES = (POLICY_RANDOM, POLICY_LOAD_BALANCING, POLICY_ADAPTIVE)


@dataclass(frozen=True)
class Admission:
    """The decision for one unit: rejected, or accepted with a delay (0 = none)."""

    rejected: bool
    delay_seconds: float


class LoadSimulator:
    """Draws admission decisions from one seeded generator, safely across threads."""

    def __init__(self, load_prob: float, load_delay: float, seed: int | None = None) -> None:
        if not 0.0 <= load_prob <= 1.0:
            raise ValueError(f"load_prob must be between 0 and 1, got {load_prob}")
        if load_delay < 0:
            raise ValueError(f"load delay must be >= 0 seconds, got {load_delay}")
        self.load_prob = load_prob
        self.load_delay = load_delay
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def admit(self, policy: int) -> Admission:
        if policy not in KNOWN_POLICIES:
            raise ValueError(f"unknown scheduling policy {policy}; known: {KNOWN_POLICIES}")
        with self._lock:
            if policy != POLICY_RANDOM and self._rng.random() < self.load_prob:
                return Admission(rejected=True, delay_seconds=0.0)
            delayed = self._rng.random() < self.load_prob
        return Admission(rejected=False, delay_seconds=self.load_delay if delayed else 0.0)
