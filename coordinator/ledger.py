"""The round engine's view of the run store: one call per event.

The store checks every transition and accepts the engine's legitimate races (a backup
answering after its round settled, an attempt closed by the end of its run), so a write
it refuses is a bug of the caller. In strict mode (`TRAINER_STRICT_LEDGER=1`, which the
tests set) the refusal is raised; otherwise it is logged, so that it cannot stop the
training it describes.

A write that SQLite could not make (disk full, file read-only, I/O error) is another
matter: from then on the store misses what happened, and a run reported as a success
would not be in it. The first such failure is kept, logged once and handed to
`on_failure` (the run cancels itself); `check()` raises it where the run must not go
on unrecorded (after a round is recorded, before the run is reported as completed).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from coordinator.records import RoundMetrics
from coordinator.run_store import RunStore, RunStoreError, StoreUnavailable

log = logging.getLogger("coordinator.ledger")
STRICT_ENV = "TRAINER_STRICT_LEDGER"


class UnitLedger:
    """Records one run's unit attempts and node answers in a RunStore (or nowhere)."""

    def __init__(self, store: RunStore | None, run_id: str,
                 on_failure: Callable[[str], None] | None = None,
                 strict: bool | None = None) -> None:
        """``strict``: raise refused writes (None: as TRAINER_STRICT_LEDGER says)."""
        self.store = store
        self.strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        self.run_id = run_id
        self.on_failure = on_failure
        self.failure: StoreUnavailable | None = None  # the first write SQLite could not make
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise the first store failure of this run, if there was one."""
        if self.failure is not None:
            raise self.failure

    def plan_units(self, round_index: int, unit_ids: list[str]) -> dict[str, int]:
        """Plan a round; returns the attempts its units already had (a round reopened by
        a resume), so the engine numbers new attempts after them."""
        self._write("plan_units", round_index, unit_ids)
        return self._write("attempts_so_far", round_index) or {}

    def plan_pass_units(self, round_index: int, pass_index: int,
                        unit_ids: list[str]) -> dict[str, int]:
        """Plan units of pass ``pass_index`` in the current round of an asynchronous run,
        adopting those a resume reopened; returns the attempts they already had."""
        self._write("plan_units", round_index, unit_ids, adopt=True, pass_index=pass_index)
        return self._write("attempts_so_far", round_index) or {}

    def gather_units(self, after_round: int, into_round: int, reason: str) -> None:
        """Move the unsettled units of the rounds after ``after_round`` into ``into_round``."""
        self._write("gather_units", after_round, into_round, reason)

    def round_ended(self, metrics: RoundMetrics, completed: int, discarded: int) -> None:
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
        except StoreUnavailable as exc:
            self._failed(exc)
        except sqlite3.Error as exc:  # the store turns these into StoreUnavailable; in case
            self._failed(StoreUnavailable(f"run store {self.store.path}: {exc}"))
        except (RunStoreError, ValueError) as exc:
            # After a failed write the store lacks what came before: refusals follow.
            if self.strict and self.failure is None:
                raise
            log.warning("run store refused %s%s: %s", method, args, exc)
        return None

    def _failed(self, exc: StoreUnavailable) -> None:
        with self._lock:
            first, self.failure = self.failure is None, self.failure or exc
        if first:
            log.error("run %s: %s", self.run_id, exc)
            if self.on_failure is not None:
                self.on_failure(str(exc))
