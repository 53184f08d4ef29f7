"""The privacy budget a private run has spent (training/privacy/accounting.py), as the
training loop reports it after each round and checks it before the next.

Epsilon is derived from the number of noised rounds applied, which is the round's index
(in buffered mode each round is one release: engine/stream_state.py): the run store
records each round before its weights leave the coordinator (a checkpoint after every
round, which a private run must keep), and a resumed run starts after the rounds the store
holds, so it recomputes the same epsilon. The sampling rate is
read when first needed: node-resident clients are known only once their nodes have
announced them, before round 1 (a private run keeps that roster: training/algorithms/
delta_avg.py). docs/privacy.md says what a crash does.
"""

from __future__ import annotations

from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.privacy import accounting
from thrift_trainer.training.privacy.accounting import Sampling

EPSILON = "epsilon"  # the figure's name in metrics.jsonl, the status and /metrics


class PrivacyBudget:
    """Epsilon of a private run after each round; `of` gives None for a run without
    privacy."""

    def __init__(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm
        self.settings = getattr(algorithm, "privacy", None)

    @classmethod
    def of(cls, algorithm: Algorithm) -> PrivacyBudget | None:
        settings = getattr(algorithm, "privacy", None)
        return cls(algorithm) if settings is not None and settings.enabled else None

    @property
    def sampling(self) -> Sampling:
        """How the rounds sample clients; ConfigError before the clients are known."""
        sampling = self.algorithm.privacy_sampling()  # type: ignore[attr-defined]
        if sampling is None:
            raise ConfigError("privacy: the run's clients are not known yet")
        return sampling

    def spent(self, rounds: int) -> float:
        """Epsilon after ``rounds`` noised rounds."""
        return accounting.epsilon(self.settings, self.sampling, rounds)

    def figures(self, rounds: int) -> dict[str, float]:
        """Epsilon after ``rounds``, and the algorithm's own figures (the adaptive clip)."""
        return {EPSILON: self.spent(rounds),
                **getattr(self.algorithm, "privacy_figures", dict)()}

    def check_plan(self, rounds: int, nodes: list[str]) -> None:
        """RoundFailed when the run's planned rounds would spend more than target_epsilon
        (or the settings cannot be accounted): node-resident clients' runs are checked so
        once their clients are known, before round 1."""
        try:
            accounting.check_plan(self.settings, self.sampling, rounds)
        except ConfigError as exc:
            raise RoundFailed(str(exc), nodes) from None

    def check_round(self, round_index: int, nodes: list[str]) -> None:
        """RoundFailed before a round that would take epsilon past target_epsilon (a run
        resumed or extended past it stops there)."""
        target = self.settings.target_epsilon
        if target and self.spent(round_index) > target:
            raise RoundFailed(
                f"privacy.target_epsilon: round {round_index} would spend epsilon "
                f"{self.spent(round_index):.4g} > {target:g}; the run stops after "
                f"{round_index - 1} rounds", nodes)
