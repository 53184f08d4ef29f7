"""Scheduling policies: which nodes to try for a unit, in which order.

A policy is a pure function of a snapshot of node views and a seeded random
generator: no sockets, no sleeps, so it unit-tests in microseconds. The engine
tries the nodes in the returned order until one accepts.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

RANDOM = 1
LOAD_BALANCING = 2
ADAPTIVE = 3
POLICY_NAMES = {RANDOM: "random", LOAD_BALANCING: "load balancing", ADAPTIVE: "adaptive"}


@dataclass(frozen=True)
class NodeView:
    """What a policy may know of a node at one instant."""

    index: int
    in_flight: int = 0
    accepted: int = 0
    rejected: int = 0
    mean_seconds: float | None = None  # mean time from call to result of its completed units
    available: bool = True  # False while benched after failures


class Policy:
    """Base class: order(views) -> node indexes to try, best first; unavailable nodes left out."""

    number: int

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def order(self, views: Sequence[NodeView]) -> list[int]:
        raise NotImplementedError


class RandomPolicy(Policy):
    """Policy 1: nodes in random order (with this policy nodes never reject)."""

    number = RANDOM

    def order(self, views: Sequence[NodeView]) -> list[int]:
        indexes = [v.index for v in views if v.available]
        with self._lock:
            self._rng.shuffle(indexes)
        return indexes


class RoundRobinPolicy(Policy):
    """Policy 2: round robin from a shared cursor; a rejection moves on to the next node."""

    number = LOAD_BALANCING

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self._cursor = 0

    def order(self, views: Sequence[NodeView]) -> list[int]:
        indexes = [v.index for v in views if v.available]
        if not indexes:
            return []
        with self._lock:  # the round-robin lock: each call starts one node further on
            start = self._cursor % len(indexes)
            self._cursor += 1
        return indexes[start:] + indexes[:start]


class AdaptivePolicy(Policy):
    """Policy 3: nodes by expected time to a result, from measured acceptance and speed.

    Expected time = (units queued on the node + 1) x mean seconds per unit / acceptance
    rate, with Laplace-smoothed acceptance and, for nodes not yet measured, the mean of
    the measured ones; ties are broken at random so unmeasured nodes get tried.
    """

    number = ADAPTIVE

    def order(self, views: Sequence[NodeView]) -> list[int]:
        candidates = [v for v in views if v.available]
        measured = [v.mean_seconds for v in candidates if v.mean_seconds is not None]
        prior = sum(measured) / len(measured) if measured else 1.0
        with self._lock:
            noise = {v.index: self._rng.random() for v in candidates}
        ranked = sorted(candidates, key=lambda v: (expected_seconds(v, prior), noise[v.index]))
        return [v.index for v in ranked]


def expected_seconds(view: NodeView, prior_seconds: float) -> float:
    """Expected wait for a result if one more unit goes to this node."""
    acceptance = (view.accepted + 1) / (view.accepted + view.rejected + 2)
    seconds = view.mean_seconds if view.mean_seconds is not None else prior_seconds
    return (view.in_flight + 1) * seconds / acceptance


POLICIES: dict[int, type[Policy]] = {
    cls.number: cls for cls in (RandomPolicy, RoundRobinPolicy, AdaptivePolicy)
}


def make_policy(number: int, seed: int | None = None) -> Policy:
    """The policy with that number, or a ValueError listing the known ones."""
    try:
        return POLICIES[number](seed)
    except KeyError:
        known = ", ".join(f"{n} {name}" for n, name in POLICY_NAMES.items())
        raise ValueError(f"unknown scheduling policy {number}; known: {known}") from None
