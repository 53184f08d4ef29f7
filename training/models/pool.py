"""Built torch modules kept between units for reuse.

Building a model costs more than loading weights into it, and a node computes many units
of one run: a unit borrows a built module (every weight is overwritten before use) and
gives it back. A few are kept per key, so units that run at once each get their own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

Built = TypeVar("Built")
MAX_POOLED = 4  # built modules kept per key


class ModulePool(Generic[Built]):
    def __init__(self) -> None:
        self._free: dict[Hashable, list[Built]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self, key: Hashable, build: Callable[[], Built]) -> Iterator[Built]:
        """A module of ``key`` (``build`` makes one when none is free)."""
        with self._lock:
            free = self._free.setdefault(key, [])
            built = free.pop() if free else None
        if built is None:
            built = build()
        try:
            yield built
        finally:
            with self._lock:
                if len(free) < MAX_POOLED:
                    free.append(built)
