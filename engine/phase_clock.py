"""Where a round's time goes: seconds per named phase, written with the round's metrics.

A synchronous round is timed in phases (``plan``: the algorithm plans its units, e.g.
MD-GAN generates its batches, and the weights are encoded once; ``units``: the units out
and back, node maths and transfers included; ``aggregate``: the update, e.g. MD-GAN's G
step; ``after_round``: e.g. MD-GAN's discriminator swaps; ``evaluate`` and ``score``:
the validation metrics and the offline scores when they are due; ``ledger``: the round's
record in the run store; ``samples``: the sample grid when due). A secure round
(coordinator/secure_rounds.py) also times its steps, inside ``units``: ``secure_keys``,
``secure_shares``, ``secure_train``, ``secure_unmask`` and ``secure_sum``. metrics.jsonl keeps them
under ``phase_seconds``, so a slow round can be read without a profiler
(bench/gan_iteration_cost.py reads them). The checkpoint, written after the row as the
commit point of a resume, is not in it. The asynchronous modes have no round barrier:
their rows time evaluate, score, ledger and samples only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from thrift_trainer.engine import runtime

PHASES_KEY = "phase_seconds"  # where a metrics.jsonl row keeps them


class PhaseClock:
    """Seconds per phase, in the order the phases first ran; a phase run twice adds up."""

    def __init__(self, clock: Callable[[], float] = runtime.monotonic) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = clock

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = self._clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self._clock() - began

    def rounded(self) -> dict[str, float]:
        """The phases to the microsecond, as a metrics row keeps them."""
        return {name: round(seconds, 6) for name, seconds in self.seconds.items()}
