"""Learning-rate schedules of a torch model's optimizers: the factor a base rate is
multiplied by at a given step, as a pure function (no torch, no state), so that every node
computes the same rate from the unit's round, and the coordinator from its step count.

* ``constant``: 1 (after the warm-up, if any).
* ``warmup_cosine``: a linear warm-up over ``warmup`` steps, then a cosine from 1 down to
  ``end`` at the last step of the schedule.
* ``linear``: the warm-up, then a straight line from 1 down to ``end``.
* ``step``: the warm-up, then multiplied by ``gamma`` every ``every`` steps (0: every third
  of the schedule after the warm-up).

The local optimizer of delta_avg counts steps across rounds: the global step of local step
``s`` of a unit of round ``r`` (1-based) is ``(r - 1) * S + s``, ``S`` the unit's own steps,
over a schedule of ``rounds * S`` steps. Optimizers on the coordinator (sync_sgd's, the
server optimizer of delta_avg) take one step per update, over ``rounds`` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("constant", "warmup_cosine", "linear", "step")


@dataclass(frozen=True)
class Schedule:
    """A schedule of ``total`` steps; `factor` of a step in [0, total)."""

    kind: str = "constant"
    total: int = 1
    warmup: int = 0
    end: float = 0.0  # the factor at the last step (warmup_cosine, linear)
    every: int = 0  # step: steps between decays; 0: a third of the decaying steps
    gamma: float = 0.1  # step: the decay per `every` steps

    @property
    def is_constant(self) -> bool:
        """Whether every factor is 1 (then an optimizer's rate is left untouched)."""
        return self.kind == "constant" and self.warmup == 0

    def factor(self, step: int) -> float:
        """The base rate's multiplier at ``step`` (0-based); past the end, the last one."""
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total - self.warmup - 1)  # the last step reaches `end`
        progress = min(1.0, max(0.0, (step - self.warmup) / span))
        if self.kind == "warmup_cosine":
            return self.end + (1.0 - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.kind == "linear":
            return 1.0 - (1.0 - self.end) * progress
        every = self.every or max(1, (self.total - self.warmup) // 3)
        return self.gamma ** (max(0, step - self.warmup) // every)


def global_step(round_index: int, steps_per_round: int, local_step: int) -> int:
    """The step across rounds of a unit's ``local_step`` in round ``round_index`` (1-based)."""
    return max(0, round_index - 1) * steps_per_round + local_step
