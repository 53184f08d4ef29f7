"""The round engine's view of the run store: one call per event, never fatal.

The store checks every transition, and the engine has legitimate races (a backup
answering after its round settled, say). A ledger write that the store refuses is
logged, not raised: the books must never stop the training they describe.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from coordinator.run_store import RunStore, RunStoreError
from wire.generated import ttypes

log = logging.getLogger("coordinator.ledger")


class UnitLedger:
    """Records one run's unit attempts and node answers in a RunStore (or nowhere)."""

    def __init__(self, store: RunStore | None, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def plan_units(self, round_index: int, unit_ids: list[str]) -> dict[str, int]:
        """Plan a round; returns the attempts its units already had (a round reopened by
        a resume), so the engine numbers new attempts after them."""
        self._write("plan_units", round_index, unit_ids)
        return self._write("attempts_so_far", round_index) or {}

    def round_ended(self, metrics: ttypes.RoundMetrics, completed: int, discarded: int) -> None:
        """Record the round; the store cancels whatever the round left unsettled."""
        self._write("record_round", metrics.round, validation_error=metrics.validation_error,
                    validation_loss=metrics.validation_loss, train_loss=metrics.train_loss,
                    seconds=metrics.seconds, completed_units=completed,
                    discarded_units=discarded)

    def run_ended(self, state: str, message: str | None) -> None:
        self._write("end_run", state, message)

    def started(self, round_index: int, unit_id: str, attempt: int, node: str) -> None:
        self._write("unit_started", round_index, unit_id, attempt, node)

    def finished(self, round_index: int, unit_id: str, attempt: int, node: str, status: str,
                 reason: str | None = None) -> None:
        self._write("unit_finished", round_index, unit_id, attempt, node, status, reason)

    def node_answer(self, node: str, outcome: str, delayed: bool, samples: int) -> None:
        self._write("node_answer", node, outcome, delayed, samples)

    def node_heartbeats(self, heard: dict[str, float]) -> None:
        self._write("node_heartbeats", heard)

    def node_failure(self, node: str, reason: str) -> None:
        self._write("node_failure", node, reason)

    def _write(self, method: str, *args: object, **kwargs: object) -> Any:
        if self.store is None:
            return None
        try:
            return getattr(self.store, method)(self.run_id, *args, **kwargs)
        except (RunStoreError, ValueError, sqlite3.Error) as exc:
            log.warning("run store refused %s%s: %s", method, args, exc)
            return None
