"""Cooperative cancellation of a unit's maths, and a count of the batches it has done.

A node runs one unit's maths at a time, so a unit that is no longer wanted (its run was
cancelled, another node finished it first, its deadline passed) must stop at once rather
than hold the node for the rest of its epochs. Training loops call ``step()`` once per
batch (per epoch where an epoch is one batch); the node's handler cancels the unit and
reads ``batches`` for its heartbeats, which tells the coordinator the unit progresses.
"""

from __future__ import annotations

import threading


class UnitCancelled(Exception):
    """The unit was cancelled; its maths stopped at a batch boundary."""


class UnitControl:
    """One unit's cancel flag and batch count, shared by its maths and its node."""

    def __init__(self, cancelled: threading.Event | None = None) -> None:
        self.cancelled = cancelled if cancelled is not None else threading.Event()
        self.batches = 0  # written by the unit's thread only, read by heartbeats

    def step(self) -> None:
        """Called before each batch: raises UnitCancelled once the unit is cancelled."""
        if self.cancelled.is_set():
            raise UnitCancelled("unit cancelled")
        self.batches += 1

    def cancel(self) -> None:
        self.cancelled.set()


def no_step() -> None:
    """The default of loops run outside a node (standalone training, tests)."""
