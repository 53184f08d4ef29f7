"""Refusing updates far larger than their peers' and than the recent ones.

A node with a bug, flipped bits or bad intent can send an update of the right shape
with finite values that would still wreck the model: a norm many times the usual.
The check keeps the norms of recent accepted updates; an update within `factor` times
their median is accepted at once. A larger one is judged against its peers, the
updates of the same round from other nodes (a bad node's own updates vouch for
nothing). When training itself is unstable (a learning rate too high) every node's
update grows at once: the run's problem, not the nodes'. So a large update is accepted
as soon as it is within `factor` times the largest of its peers, and refused only once
it is over `factor` times every one of a few peers (or of all the round could give
within the wait): far above all of them, not just above a few small ones, since the
updates of an unstable round can differ twenty-fold. The first updates of a run set
the scale, so the check starts once `warmup` of them are in. The recent norms are a run's
(`RecentNorms`): guards of rounds that run at once (a relay's units) may share them.

A hard batch is not a lie: a unit whose gradient spikes gives the same large update on
every node that computes it, and refusing it again on each would only burn the round's time
(and discard the unit). So a refused norm is remembered with its unit and node; when
another node's result for the same unit comes with the same norm (to `AGREEMENT`, relative),
two nodes vouch for it and it is accepted, with a warning. A lying node cannot do that alone.
The node refused first was honest after all: `vindicate` is called with its name, so that
it leaves the bench it was sent to.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections import deque
from collections.abc import Callable, Hashable, Mapping

import numpy as np

from thrift_trainer.engine import runtime

log = logging.getLogger("coordinator.engine")

RECENT = 64
PEERS = 4  # updates of other nodes in the round a large one must dwarf to be refused
AGREEMENT = 1e-4  # relative difference under which two nodes' norms of a unit agree
REFUSED_KEPT = 256  # refused (unit, node, norm) remembered for agreement, the latest


class RecentNorms:
    """The norms of a run's recent accepted updates; thread-safe."""

    def __init__(self) -> None:
        self._norms: deque[float] = deque(maxlen=RECENT)
        self._lock = runtime.Lock()

    def add(self, norm: float) -> None:
        with self._lock:
            self._norms.append(norm)

    def median(self, at_least: int) -> float | None:
        """Their median, once there are ``at_least`` of them; else None."""
        with self._lock:
            norms = list(self._norms)
        return statistics.median(norms) if norms and len(norms) >= at_least else None


class NormGuard:
    """Thread-safe: `check(update)` raises ValueError for an update to refuse.

    Call `start_round(units, nodes)` before each round's results and `end_round()` after, so
    a check waiting for peers stops waiting once the round is over."""

    def __init__(self, factor: float | None, warmup: int = 8,
                 recent: RecentNorms | None = None) -> None:
        self.factor = factor
        self.warmup = warmup
        self._recent = recent or RecentNorms()
        self._round: dict[Hashable, tuple[str, float]] = {}  # unit -> (node, latest norm)
        self._peers_needed = PEERS
        self._round_over = False
        self._warned_unstable = False
        self._anonymous = itertools.count()
        self._refused: deque[tuple[Hashable, str, float]] = deque(maxlen=REFUSED_KEPT)
        self._cond = runtime.Condition()

    def start_round(self, units: int, nodes: int) -> None:
        """A new round of `units` results over `nodes` nodes: forget the last round's."""
        with self._cond:
            self._round = {}
            self._peers_needed = max(0, min(PEERS, units - 1, nodes - 1))
            self._round_over = False

    def end_round(self) -> None:
        with self._cond:
            self._round_over = True
            self._cond.notify_all()

    def check(self, update: Mapping[str, np.ndarray], unit: Hashable | None = None,
              node: str = "", wait_seconds: float = 0.0,
              should_stop: Callable[[], bool] = lambda: False,
              vindicate: Callable[[str], None] = lambda node: None) -> float:
        """The update's L2 norm over all its tensors, if acceptable; else ValueError.
        A norm over the recent bound waits up to `wait_seconds` for peers of its round
        (or until `should_stop()`) before it is judged. `vindicate(node)`: a node whose
        refused result of the same unit this one vouches for (a hard batch)."""
        norm = update_norm(update)
        key = next(self._anonymous) if unit is None else unit
        with self._cond:
            self._round[key] = (node, norm)
            self._cond.notify_all()
            typical = self._typical()
            if typical is None or norm <= self.factor * typical:
                self._recent.add(norm)
                return norm
            if (refused_first := self._vouched(unit, node, norm)) is not None:
                self._recent.add(norm)
                vindicate(refused_first)
                return norm
            peers = self._wait_for_peers(key, node, norm, runtime.monotonic() + wait_seconds,
                                         should_stop)
            try:
                self._judge(norm, typical, peers)
            except ValueError:
                if unit is not None:
                    self._refused.append((unit, node, norm))
                raise
            self._recent.add(norm)
        return norm

    def _vouched(self, unit: Hashable | None, node: str, norm: float) -> str | None:
        """The other node whose refused result of `unit` had the same norm: a hard batch
        both computed alike, not a lie (warned about, so a spike shows in the log); None
        if there is none."""
        if unit is None:
            return None
        for refused_unit, other, refused_norm in self._refused:
            if (refused_unit == unit and other != node
                    and abs(refused_norm - norm) <= AGREEMENT * max(refused_norm, norm)):
                log.warning("unit %s: update norm %.4g is far above the recent ones, but "
                            "nodes %s and %s computed it alike: a hard batch, accepted",
                            unit, norm, other, node)
                return other
        return None

    def _typical(self) -> float | None:
        """The median of recent accepted norms, once the check applies; else None."""
        if not self.factor:
            return None
        typical = self._recent.median(self.warmup)
        return typical if typical else None

    def _peers(self, key: Hashable, node: str) -> list[float]:
        return [n for k, (other, n) in self._round.items() if k != key and other != node]

    def _wait_for_peers(self, key: Hashable, node: str, norm: float, deadline: float,
                        should_stop: Callable[[], bool]) -> list[float]:
        """The peers to judge `norm` by: once one vouches for it, once enough are in,
        or, at the deadline or the round's end, those there are."""
        while True:
            peers = self._peers(key, node)
            if peers and norm <= self.factor * max(peers):
                return peers
            remaining = deadline - runtime.monotonic()
            if (len(peers) >= self._peers_needed or self._round_over or remaining <= 0
                    or should_stop()):
                return peers
            self._cond.wait(min(remaining, 0.25))

    def _judge(self, norm: float, typical: float, peers: list[float]) -> None:
        """Refuse a norm far above all its peers' (without peers: above the recent ones)."""
        recent = (f"{norm / typical:.1f}x the median of recent updates ({typical:.4g}); "
                  f"the limit is {self.factor:g}x (--max-update-norm)")
        if not peers:  # nothing to compare with: if every update grows, lower the rate
            raise ValueError(f"update norm {norm:.4g} is {recent}, and no other node's "
                             f"update of the round to compare with (if all updates grow, "
                             f"lower the learning rate)")
        top = max(peers)
        if norm > self.factor * top:
            raise ValueError(f"update norm {norm:.4g} is {norm / top:.1f}x the largest of "
                             f"{len(peers)} other nodes' updates of the round ({top:.4g}) "
                             f"and {recent}")
        if not self._warned_unstable:
            self._warned_unstable = True
            log.warning("training looks unstable: updates grow together (norm %.4g, %.1fx the "
                        "median of recent ones); accepting them, since no node stands out; "
                        "a lower learning rate may help", norm, norm / typical)


NORM_BLOCK = 1 << 20  # elements converted to float64 at a time


def update_norm(update: Mapping[str, np.ndarray]) -> float:
    """The update's L2 norm over all its tensors, summed in float64 a block at a time (no
    float64 copy of a big tensor)."""
    total = 0.0
    for value in update.values():
        flat = np.asarray(value).reshape(-1)
        for start in range(0, flat.size, NORM_BLOCK):
            block = flat[start:start + NORM_BLOCK].astype(np.float64)
            total += float(np.dot(block, block))
    return float(np.sqrt(total))
