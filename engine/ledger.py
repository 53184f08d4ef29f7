"""The round engine's view of the run store: one call per event.

The store checks every transition and accepts the engine's legitimate races (a backup
answering after its round settled, an attempt closed by the end of its run), so a write
it refuses is a bug of the caller. In strict mode (`TRAINER_STRICT_LEDGER=1`, which the
tests set) the refusal is raised; otherwise it is logged, so that it cannot stop the
training it describes.

A write the store could not make (disk full, file read-only, I/O error: `StoreUnavailable`)
is another matter: from then on the store misses what happened, and a run reported as a
success would not be in it. The first such failure is kept, logged once and handed to
`on_failure` (the run cancels itself); `check()` raises it where the run must not go
on unrecorded (after a round is recorded, before the run is reported as completed).

The engine reaches the store only through `LedgerStore`, the calls below; the coordinator's
run stores (coordinator/store_protocol.py: SQLite's and PostgreSQL's) implement it, and a
relay's engine runs without one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from thrift_trainer.engine import runtime
from thrift_trainer.engine.records import RoundMetrics

log = logging.getLogger("engine.ledger")
STRICT_ENV = "TRAINER_STRICT_LEDGER"


class RunStoreError(Exception):
    """A store refused a call or failed; base of the store's errors."""


class StoreUnavailable(RunStoreError):
    """The store could not read or write (disk full, read-only, I/O error): what it holds
    may now lag behind what happened, so a run must not go on as if it were recorded. The
    message names the store and the cause."""


class LedgerStore(Protocol):
    """The calls the ledger makes of a run store. A refusal (an illegal transition, an
    unknown unit) raises RunStoreError or ValueError; a write it could not make raises
    StoreUnavailable."""

    def plan_units(self, run_id: str, round_index: int, unit_ids: Iterable[str],
                   adopt: bool = False, pass_index: int | None = None) -> int: ...

    def attempts_so_far(self, run_id: str, round_index: int) -> dict[str, int]: ...

    def gather_units(self, run_id: str, after_round: int, into_round: int,
                     reason: str) -> int: ...

    def record_round(self, run_id: str, round_index: int, *, validation_error: float,
                     validation_loss: float, train_loss: float, seconds: float,
                     completed_units: int, discarded_units: int) -> int: ...

    def end_run(self, run_id: str, state: str, message: str | None = None) -> int: ...

    def unit_started(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                     node: str) -> None: ...

    def unit_finished(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                      node: str, status: str, reason: str | None = None) -> str: ...

    def node_answer(self, run_id: str, node: str, outcome: str, delayed: bool,
                    samples: int = 0) -> None: ...

    def node_failure(self, run_id: str, node: str, reason: str | None = None) -> None: ...

    def node_heartbeats(self, run_id: str, heard: Mapping[str, float]) -> None: ...


class UnitLedger:
    """Records one run's unit attempts and node answers in a LedgerStore (or nowhere)."""

    def __init__(self, store: LedgerStore | None, run_id: str,
                 on_failure: Callable[[str], None] | None = None,
                 strict: bool | None = None) -> None:
        """``strict``: raise refused writes (None: as TRAINER_STRICT_LEDGER says)."""
        self.store = store
        # the store's calls, bound; a ledger without a store writes nowhere
        self._store: Any = store if store is not None else _NoStore()
        self.strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        self.run_id = run_id
        self.on_failure = on_failure
        self.failure: StoreUnavailable | None = None  # the first write the store could not make
        self._lock = runtime.Lock()

    def check(self) -> None:
        """Raise the first store failure of this run, if there was one."""
        if self.failure is not None:
            raise self.failure

    def plan_units(self, round_index: int, unit_ids: list[str]) -> dict[str, int]:
        """Plan a round; returns the attempts its units already had (a round reopened by
        a resume), so the engine numbers new attempts after them."""
        self._write(self._store.plan_units, round_index, unit_ids)
        return self._write(self._store.attempts_so_far, round_index) or {}

    def plan_pass_units(self, round_index: int, pass_index: int,
                        unit_ids: list[str]) -> dict[str, int]:
        """Plan units of pass ``pass_index`` in the current round of an asynchronous run,
        adopting those a resume reopened; returns the attempts they already had."""
        self._write(self._store.plan_units, round_index, unit_ids, adopt=True,
                    pass_index=pass_index)
        return self._write(self._store.attempts_so_far, round_index) or {}

    def gather_units(self, after_round: int, into_round: int, reason: str) -> None:
        """Move the unsettled units of the rounds after ``after_round`` into ``into_round``."""
        self._write(self._store.gather_units, after_round, into_round, reason)

    def round_ended(self, metrics: RoundMetrics, completed: int, discarded: int) -> None:
        """Record the round; the store cancels whatever the round left unsettled."""
        self._write(self._store.record_round, metrics.round,
                    validation_error=metrics.validation_error,
                    validation_loss=metrics.validation_loss, train_loss=metrics.train_loss,
                    seconds=metrics.seconds, completed_units=completed,
                    discarded_units=discarded)

    def run_ended(self, state: str, message: str | None) -> None:
        self._write(self._store.end_run, state, message)

    def started(self, round_index: int, unit_id: str, attempt: int, node: str) -> None:
        self._write(self._store.unit_started, round_index, unit_id, attempt, node)

    def finished(self, round_index: int, unit_id: str, attempt: int, node: str, status: str,
                 reason: str | None = None) -> None:
        self._write(self._store.unit_finished, round_index, unit_id, attempt, node, status,
                    reason)

    def keep_result(self, round_index: int, unit_id: str, attempt: int, node: str,
                    num_samples: int, loss: float, names: str, data: bytes,
                    sequence: int | None = None, staleness: int | None = None) -> None:
        """Keep a completed unit's result in a store that keeps results, so a coordinator
        taking the run over uses it instead of computing it again
        (coordinator/kept_results.py)."""
        self._write(self._store.keep_result, round_index, unit_id, attempt, node, num_samples,
                    loss, names, data, sequence, staleness)

    def node_answer(self, node: str, outcome: str, delayed: bool, samples: int) -> None:
        self._write(self._store.node_answer, node, outcome, delayed, samples)

    def node_heartbeats(self, heard: dict[str, float]) -> None:
        self._write(self._store.node_heartbeats, heard)

    def node_failure(self, node: str, reason: str) -> None:
        self._write(self._store.node_failure, node, reason)

    def _write(self, method: Callable[..., Any], *args: object, **kwargs: object) -> Any:
        try:
            return method(self.run_id, *args, **kwargs)
        except StoreUnavailable as exc:
            self._failed(exc)
        except (RunStoreError, ValueError) as exc:
            # After a failed write the store lacks what came before: refusals follow.
            if self.strict and self.failure is None:
                raise
            log.warning("run store refused %s%s: %s", method.__name__, args, exc)
        return None

    def _failed(self, exc: StoreUnavailable) -> None:
        with self._lock:
            first, self.failure = self.failure is None, self.failure or exc
        if first:
            log.error("run %s: %s", self.run_id, exc)
            if self.on_failure is not None:
                self.on_failure(str(exc))


class _NoStore:
    """The store of a ledger that has none (a relay's engine): every call goes nowhere."""

    def _nothing(self, *args: object, **kwargs: object) -> None:
        return None

    plan_units = attempts_so_far = gather_units = record_round = end_run = _nothing
    unit_started = unit_finished = keep_result = _nothing
    node_answer = node_heartbeats = node_failure = _nothing
