"""Refusing updates whose size is far beyond the recent ones.

A node with a bug, flipped bits or bad intent can send an update of the right shape
with finite values that would still wreck the model: a norm many times the usual.
The check keeps the norms of recent accepted updates and refuses one larger than
`factor` times their median; the engine then counts a failure, records the reason
and gives the unit to another node. The first updates of a run set the scale, so the
check starts once `warmup` of them are in.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Mapping

import numpy as np

RECENT = 64


class NormGuard:
    """Thread-safe: `check(update)` raises ValueError for an update to refuse."""

    def __init__(self, factor: float | None, warmup: int = 8) -> None:
        self.factor = factor
        self.warmup = warmup
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._lock = threading.Lock()

    def check(self, update: Mapping[str, np.ndarray]) -> float:
        """The update's L2 norm over all its tensors, if acceptable; else ValueError."""
        norm = update_norm(update)
        with self._lock:
            if self.factor and len(self._recent) >= self.warmup:
                typical = statistics.median(self._recent)
                if typical > 0 and norm > self.factor * typical:
                    raise ValueError(f"update norm {norm:.4g} is {norm / typical:.1f}x the median "
                                     f"of recent updates ({typical:.4g}); the limit is "
                                     f"{self.factor:g}x (--max-update-norm)")
            self._recent.append(norm)
        return norm


def update_norm(update: Mapping[str, np.ndarray]) -> float:
    total = 0.0
    for value in update.values():
        flat = np.asarray(value, dtype=np.float64).ravel()
        total += float(np.dot(flat, flat))
    return float(np.sqrt(total))
