"""Scheduling policies: which nodes to try for a unit, in which order.

A policy is a pure function of a snapshot of node views and a seeded random
generator: no sockets, no sleeps, so it unit-tests in microseconds. The engine
tries the nodes in the returned order until one accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from thrift_trainer.engine import runtime

RANDOM = 1
LOAD_BALANCING = 2
ADAPTIVE = 3
POLICY_NAMES = {RANDOM: "random", LOAD_BALANCING: "load balancing", ADAPTIVE: "adaptive"}


class NodeView(NamedTuple):
    """What a policy may know of a node at one instant. A named tuple, not a dataclass:
    the engine makes one per node for every attempt, and a frozen dataclass costs
    2.5 times as much to make (48 nodes: a tenth of a millisecond per unit)."""

    index: int
    in_flight: int = 0
    admitted: int = 0  # units the node accepted (finished or cancelled later)
    rejected: int = 0
    delayed: int = 0  # admitted units that sat in a load delay
    compute_seconds: float | None = None  # typical call time of a unit that was not delayed
    delay_seconds: float | None = None  # typical wait of a delayed unit
    available: bool = True  # False while benched after failures


class Policy:
    """Base class: order(views) -> node indexes to try, best first; unavailable nodes left out."""

    number: int
    # False: the order depends only on which nodes are available (`order_available`), so
    # the engine need not make a view of every node for every attempt
    ranks_by_views = True
    rerank_after_rejection = False  # True: ask for a new order after every rejection
    # True: backups start after 3x the measured unit time (engine/stragglers.py)
    measured_backups = False

    def __init__(self, seed: int | None = None) -> None:
        self._rng = runtime.Random(seed)
        self._lock = runtime.Lock()

    def order(self, views: Sequence[NodeView]) -> list[int]:
        raise NotImplementedError

    def order_available(self, indexes: list[int]) -> list[int]:
        """The order over the available nodes `indexes` (a policy that does not rank by
        views); the list may be reordered in place."""
        raise NotImplementedError

    def random_state(self) -> Any:
        """The random generator's state, for a checkpoint."""
        with self._lock:
            return self._rng.getstate()

    def set_random_state(self, state: Any) -> None:
        with self._lock:
            self._rng.setstate(state)



class RandomPolicy(Policy):
    """Policy 1: nodes in random order (with this policy nodes never reject)."""

    number = RANDOM
    ranks_by_views = False

    def order(self, views: Sequence[NodeView]) -> list[int]:
        return self.order_available([v.index for v in views if v.available])

    def order_available(self, indexes: list[int]) -> list[int]:
        with self._lock:
            self._rng.shuffle(indexes)
        return indexes


class RoundRobinPolicy(Policy):
    """Policy 2: round robin from a shared cursor; a rejection moves on to the next node."""

    number = LOAD_BALANCING
    ranks_by_views = False

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self._cursor = 0

    def order(self, views: Sequence[NodeView]) -> list[int]:
        return self.order_available([v.index for v in views if v.available])

    def order_available(self, indexes: list[int]) -> list[int]:
        if not indexes:
            return []
        with self._lock:  # the round-robin lock: each call starts one node further on
            start = self._cursor % len(indexes)
            self._cursor += 1
        return indexes[start:] + indexes[:start]


class AdaptivePolicy(Policy):
    """Policy 3: nodes by expected time to a result, from what each node has shown.

    Expected time = the units ahead of it x its unit time + its delay rate x its
    typical delay + a retry cost per expected rejection. Rates are Laplace-smoothed;
    a node not yet measured is assumed typical of the measured ones; ties are broken
    at random so new nodes get tried.
    """

    number = ADAPTIVE
    rerank_after_rejection = True
    measured_backups = True

    def order(self, views: Sequence[NodeView]) -> list[int]:
        candidates = [v for v in views if v.available]
        prior = Priors.of(candidates)
        with self._lock:
            noise = {v.index: self._rng.random() for v in candidates}
        ranked = sorted(candidates, key=lambda v: (expected_seconds(v, prior), noise[v.index]))
        return [v.index for v in ranked]


@dataclass(frozen=True)
class Priors:
    """Stand-ins for a node's unmeasured timings: the mean over measured nodes."""

    compute_seconds: float = 0.05
    delay_seconds: float = 1.0

    @classmethod
    def of(cls, views: Sequence[NodeView]) -> Priors:
        compute = [v.compute_seconds for v in views if v.compute_seconds is not None]
        delay = [v.delay_seconds for v in views if v.delay_seconds is not None]
        return cls(sum(compute) / len(compute) if compute else cls.compute_seconds,
                   sum(delay) / len(delay) if delay else cls.delay_seconds)


REJECTION_COST_SECONDS = 0.002  # one refused call on a local network


def expected_seconds(view: NodeView, prior: Priors) -> float:
    """Expected wait for a result if one more unit goes to this node."""
    acceptance = (view.admitted + 1) / (view.admitted + view.rejected + 2)
    delay_rate = (view.delayed + 1) / (view.admitted + 2)
    compute = view.compute_seconds if view.compute_seconds is not None else prior.compute_seconds
    delay = view.delay_seconds if view.delay_seconds is not None else prior.delay_seconds
    retries = 1 / acceptance - 1
    return (view.in_flight + 1) * compute + delay_rate * delay + retries * REJECTION_COST_SECONDS


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
