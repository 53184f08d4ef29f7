"""The ledger's queries, shared by the SQLite and the PostgreSQL store: each reads one
snapshot, after whatever writes the store still had to make (`_before_read`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from thrift_trainer.coordinator.ledger_sql import NODE_RECORD_COLUMNS, LedgerSql
from thrift_trainer.coordinator.ledger_steps import run_record, unfinished
from thrift_trainer.coordinator.store_calls import reads_what_was_written
from thrift_trainer.coordinator.store_records import (
    MAX_LIST,
    UNIT_STATUSES,
    UNSETTLED,
    NodeRecord,
    RoundRecord,
    RunRecord,
    UnfinishedUnit,
    UnitEvent,
)


class LedgerReads:
    """The queries; the store gives the statements, the clock and its transactions."""

    _q: LedgerSql
    _clock: Callable[[], float]

    def _before_read(self) -> None:
        raise NotImplementedError

    def _tx(self, write: bool = True) -> AbstractContextManager[Any]:
        raise NotImplementedError

    @reads_what_was_written
    def get_run(self, run_id: str) -> RunRecord | None:
        """One run, or None if the store has no such run."""
        with self._tx(write=False) as db:
            row = db.execute(self._q.get_run, (run_id,)).fetchone()
        return None if row is None else run_record(row)

    @reads_what_was_written
    def list_runs(self, limit: int = 20) -> list[RunRecord]:
        """The newest runs first (by creation time, then by insertion), at most `limit`."""
        if not 1 <= limit <= MAX_LIST:
            raise ValueError(f"limit must be between 1 and {MAX_LIST}, got {limit}")
        with self._tx(write=False) as db:
            rows = db.execute(self._q.list_runs, (limit,)).fetchall()
        return [run_record(row) for row in rows]

    @reads_what_was_written
    def list_rounds(self, run_id: str) -> list[RoundRecord]:
        """The recorded rounds of a run, in order."""
        with self._tx(write=False) as db:
            rows = db.execute(self._q.list_rounds, (run_id,)).fetchall()
        return [RoundRecord(*row) for row in rows]

    @reads_what_was_written
    def unfinished_units(self, run_id: str) -> list[UnfinishedUnit]:
        """Every unit not yet settled, the longest-waiting first, with its owner node,
        age and attempts: what a stalled round is waiting for."""
        now = self._clock()
        with self._tx(write=False) as db:
            units = db.execute(self._q.unsettled_units, (run_id, *UNSETTLED)).fetchall()
            live = db.execute(self._q.live_attempts, (run_id,)).fetchall()
        owners: dict[tuple[int, str], list[tuple[str, float]]] = {}
        for round_index, unit_id, node, started in live:
            owners.setdefault((round_index, unit_id), []).append((node, started))
        result = [unfinished(row, owners.get((row[0], row[1]), []), now) for row in units]
        return sorted(result, key=lambda u: (-u.age_seconds, u.round, u.unit_id))

    @reads_what_was_written
    def latest_discard(self, run_id: str) -> str | None:
        """Why the run's latest discarded unit was given up, as a live run's progress
        says it ("unit <id> on <node>: <why>"); None if none was."""
        with self._tx(write=False) as db:
            row = db.execute(self._q.latest_discard, (run_id,)).fetchone()
        if row is None:
            return None
        unit_id, node, reason = row
        return f"unit {unit_id} on {node or '?'}: {reason or 'no reason recorded'}"

    @reads_what_was_written
    def unit_history(self, run_id: str, round_index: int, unit_id: str) -> list[UnitEvent]:
        """Every status change of one unit, oldest first, to replay what happened."""
        with self._tx(write=False) as db:
            rows = db.execute(self._q.unit_history, (run_id, round_index, unit_id)).fetchall()
        return [UnitEvent(*row) for row in rows]

    @reads_what_was_written
    def ledger_counts(self, run_id: str, round_index: int | None = None) -> dict[str, int]:
        """Units per status (every status present, zeros included) for a run or one
        round: their sum is the number planned, so "nothing lost" is a count. A run's are
        read from the counts its units' triggers keep where the store has them (SQLite)."""
        with self._tx(write=False) as db:
            if round_index is None:
                rows = db.execute(self._q.run_counts, (run_id,)).fetchall()
            else:
                rows = db.execute(self._q.round_counts, (run_id, round_index)).fetchall()
        counts = dict.fromkeys(UNIT_STATUSES, 0)
        counts.update(dict(rows))
        return counts

    @reads_what_was_written
    def pass_counts(self, run_id: str) -> dict[int, dict[str, int]]:
        """Units per pass and status of an asynchronous run (units enter the store when
        first sent, so a pass holds the units sent so far)."""
        counts: dict[int, dict[str, int]] = {}
        with self._tx(write=False) as db:
            for pass_index, status, n in db.execute(self._q.pass_counts, (run_id,)):
                counts.setdefault(pass_index, {})[status] = n
        return counts

    @reads_what_was_written
    def node_stats(self, run_id: str) -> list[NodeRecord]:
        """Per-node counts of a run, by node name."""
        with self._tx(write=False) as db:
            rows = db.execute(self._q.node_stats, (run_id,)).fetchall()
        return [NodeRecord(**dict(zip(NODE_RECORD_COLUMNS, row, strict=True))) for row in rows]


