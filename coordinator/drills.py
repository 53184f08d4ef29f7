"""A coordinator that dies at a chosen point, for failover drills and tests.

`TRAINER_COORDINATOR_DIES_AT=POINT:ROUND` in the coordinator's environment makes it
SIGKILL itself when round ROUND reaches POINT: `aggregate` (its results are in, the update
not yet applied) or `checkpoint` (the checkpoint file is written, the run store holds the
previous one and every result the round kept, and the transaction that replaces the
checkpoint there is open, one part written).
Unset, as always outside drills, a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

DIES_AT_VARIABLE = "TRAINER_COORDINATOR_DIES_AT"
POINTS = ("aggregate", "checkpoint")


def point(name: str, round_index: int, ready: Callable[[], None] | None = None) -> None:
    """Die here if the environment says so (see the module docstring), once ``ready()``
    has returned: what the drill lets finish first, so that a test knows what the run
    store holds at the death."""
    if os.environ.get(DIES_AT_VARIABLE) == f"{name}:{round_index}":
        if ready is not None:
            ready()
        os.kill(os.getpid(), signal.SIGKILL)
