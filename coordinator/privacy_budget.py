"""The privacy budget a private run has spent (training/privacy/accounting.py), as the
training loop reports it after each round and checks it before the next.

Epsilon is derived from the number of noised rounds applied, which in sync rounds is the
round's index: the run store records each round before its weights leave the coordinator
(a checkpoint after every round, which a private run must keep), and a resumed run starts
after the rounds the store holds, so it recomputes the same epsilon. docs/privacy.md says
what a crash does.
"""

from __future__ import annotations

from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.privacy import accounting

EPSILON = "epsilon"  # the figure's name in metrics.jsonl, the status and /metrics


class PrivacyBudget:
    """Epsilon of a private run after each round; `of` gives None for a run without
    privacy."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.settings = getattr(algorithm, "privacy", None)
        self.sampling = getattr(algorithm, "privacy_sampling", lambda: None)()

    @classmethod
    def of(cls, algorithm: Algorithm) -> PrivacyBudget | None:
        budget = cls(algorithm)
        return budget if budget.sampling is not None else None

    def spent(self, rounds: int) -> float:
        """Epsilon after ``rounds`` noised rounds."""
        return accounting.epsilon(self.settings, self.sampling, rounds)

    def figures(self, rounds: int) -> dict[str, float]:
        return {EPSILON: self.spent(rounds)}

    def check_round(self, round_index: int, nodes: list[str]) -> None:
        """RoundFailed before a round that would take epsilon past target_epsilon (a run
        resumed or extended past it stops there)."""
        target = self.settings.target_epsilon
        if target and self.spent(round_index) > target:
            raise RoundFailed(
                f"privacy.target_epsilon: round {round_index} would spend epsilon "
                f"{self.spent(round_index):.4g} > {target:g}; the run stops after "
                f"{round_index - 1} rounds", nodes)
