"""The privacy budget a private run has spent (training/privacy/accounting.py), as the
training loop reports it after each round and checks it before the next.

Epsilon is derived from the number of noised releases: the round's index (in buffered mode
each round is one release: engine/stream_state.py), or the releases the run store has
charged (coordinator/ledger_charges.py), whichever is more. Each release is charged,
committed, before anyone can see it:

- distributed DP (a secure round, coordinator/secure_rounds.py): before the unmask step,
  after which the coordinator, the party the clients' noise protects against, can learn
  the noised sum. Each computation is charged: a round computed again after a crash was
  seen twice and counts twice;
- central DP: before the round is written (its status, metrics, checkpoint; its weights
  leave after the checkpoint), once per round: a round computed again after a crash was
  seen by nobody the first time, and is computed with the same noise.

A resumed run, or one a standby took over, reads the charges back, so it never counts
fewer releases than were seen. The sampling rate is read when first needed: node-resident
clients are known only once their nodes have announced them, before round 1 (a private
run keeps that roster: training/algorithms/delta_avg.py). docs/privacy.md says what a
crash does.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.privacy import accounting
from thrift_trainer.training.privacy.accounting import Sampling

EPSILON = "epsilon"  # the figure's name in metrics.jsonl, the status and /metrics


@runtime_checkable
class ChargeStore(Protocol):
    """Where charges are recorded: a run store (coordinator/ledger_charges.py)."""

    def charge_release(self, run_id: str, round_index: int, epsilon: float,
                       once_per_round: bool = False) -> int: ...

    def privacy_charges(self, run_id: str) -> list: ...


class PrivacyBudget:
    """Epsilon of a private run after each round; `of` gives None for a run without
    privacy."""

    def __init__(self, algorithm: Algorithm, store: object = None, run_id: str = "",
                 each_computation: bool = False) -> None:
        """``store``: where the run's charges are recorded (a ChargeStore; anything else:
        counted in memory only, as a run without a store can); ``each_computation``:
        charge every computation of a round (distributed DP), not once per round."""
        self.algorithm = algorithm
        self.settings = getattr(algorithm, "privacy", None)
        self.store = store if isinstance(store, ChargeStore) else None
        self.run_id = run_id
        self.each_computation = each_computation
        self._charged: int | None = None  # read from the store when first needed

    @classmethod
    def of(cls, algorithm: Algorithm, store: object = None, run_id: str = "",
           each_computation: bool = False) -> PrivacyBudget | None:
        settings = getattr(algorithm, "privacy", None)
        return cls(algorithm, store, run_id, each_computation) \
            if settings is not None and settings.enabled else None

    @property
    def charged(self) -> int:
        """The releases charged so far, a resumed run's before it included."""
        if self._charged is None:
            self._charged = len(self.store.privacy_charges(self.run_id)) \
                if self.store is not None else 0
        return self._charged

    def releases(self, round_index: int) -> int:
        """The releases counted once round ``round_index`` is computed (and charged)."""
        return max(round_index, self.charged)

    def charge(self, round_index: int) -> None:
        """Charge a release of round ``round_index``, committed in the store before this
        returns (StoreUnavailable when it cannot be: the release must not happen)."""
        after = self._after(round_index)
        if self.store is None:
            self._charged = self.charged + 1 if self.each_computation else after
            return
        self._charged = self.store.charge_release(self.run_id, round_index,
                                                  self.spent(after),
                                                  once_per_round=not self.each_computation)

    def _after(self, round_index: int) -> int:
        """The releases counted once round ``round_index`` is charged: a charge more in
        distributed DP; in central DP the round's (charged at most once)."""
        extra = 1 if self.each_computation else 0
        return max(round_index, self.charged + extra)

    @property
    def sampling(self) -> Sampling:
        """How the rounds sample clients; ConfigError before the clients are known."""
        sampling = self.algorithm.privacy_sampling()  # type: ignore[attr-defined]
        if sampling is None:
            raise ConfigError("privacy: the run's clients are not known yet")
        return sampling

    def spent(self, releases: int) -> float:
        """Epsilon after ``releases`` noised releases."""
        return accounting.epsilon(self.settings, self.sampling, releases)

    def figures(self, round_index: int) -> dict[str, float]:
        """Epsilon once round ``round_index`` is computed and charged, and the algorithm's
        own figures (the adaptive clip)."""
        return {EPSILON: self.spent(self.releases(round_index)),
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
        resumed or extended past it stops there; one charged a release more, a round
        computed twice, one round earlier)."""
        target = self.settings.target_epsilon
        if not target:
            return
        would = self.spent(self._after(round_index))
        if would > target:
            raise RoundFailed(
                f"privacy.target_epsilon: round {round_index} would spend epsilon "
                f"{would:.4g} > {target:g}; the run stops after "
                f"{round_index - 1} rounds", nodes)
