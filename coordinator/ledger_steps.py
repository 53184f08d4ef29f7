"""The ledger's steps inside a transaction, on either database: checks of what a call
asks for, and the reads and writes that several of the store's calls share. Each takes
the transaction's connection and the store's statements (coordinator/ledger_sql.py)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from itertools import islice
from typing import Any

from thrift_trainer.coordinator.ledger_sql import LedgerSql
from thrift_trainer.coordinator.store_protocol import Database
from thrift_trainer.coordinator.store_records import (
    COUNTED_FAILURES,
    LATE_ENDS,
    MAX_UNITS_PER_CALL,
    SETTLED,
    UNSETTLED,
    IllegalTransition,
    RunRecord,
    UnfinishedUnit,
    UnitKey,
    UnknownRecord,
)


def null_if_nan(value: float) -> float | None:
    """NaN is stored as NULL: SQLite does so by itself, PostgreSQL would keep the NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value


def check_text(what: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


def check_unit_ids(unit_ids: Iterable[str]) -> list[str]:
    ids = list(islice(unit_ids, MAX_UNITS_PER_CALL + 1))
    if len(ids) > MAX_UNITS_PER_CALL:
        raise ValueError(f"at most {MAX_UNITS_PER_CALL} units per call")
    for unit_id in ids:
        check_text("unit id", unit_id)
    repeated = sorted(u for u, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ValueError(f"unit ids repeated: {', '.join(repeated[:5])}")
    return ids


def check_new_units(db: Database, q: LedgerSql, run_id: str, round_index: int,
                    ids: list[str], adopt: bool = False) -> list[str]:
    """The ids to insert: a reopened round (see resume_run) plans again exactly the
    units it has, all pending; with ``adopt``, units the round holds unsettled are
    left as they are; any other clash is an error."""
    existing = dict(db.execute(q.round_units, (run_id, round_index)))
    if existing and set(existing) == set(ids) and _reopened(db, q, run_id, round_index,
                                                            existing, kept_allowed=not adopt):
        return []
    if adopt:
        ids = [u for u in ids if existing.get(u) not in UNSETTLED]
    clash = sorted(set(existing).intersection(ids))
    if clash:
        raise ValueError(f"round {round_index} of run {run_id} already has units "
                         f"{', '.join(clash[:5])}")
    return ids


def _reopened(db: Database, q: LedgerSql, run_id: str, round_index: int,
              existing: dict[str, str], kept_allowed: bool) -> bool:
    """Whether a round's units are as a resume left them: pending, or (``kept_allowed``,
    a round, not a stream's) completed with a result kept from before (see resume_run),
    in a round not recorded yet."""
    statuses = set(existing.values())
    if statuses == {"pending"}:
        return True
    return kept_allowed and statuses <= {"pending", "completed"} and db.execute(
        q.round_recorded, (run_id, round_index)).fetchone() is None


def move_unit_row(db: Database, q: LedgerSql, key: UnitKey, into_round: int) -> None:
    """Re-key a unit row, its attempts and events to ``into_round``: the new row first,
    its children next, the old row last, so no foreign key ever points nowhere."""
    db.execute(q.copy_unit_into, (into_round, *key))
    db.execute(q.move_attempts, (into_round, *key))
    db.execute(q.move_events, (into_round, *key))
    db.execute(q.delete_unit, key)


def name(key: UnitKey) -> str:
    return f"unit {key[2]} (run {key[0]}, round {key[1]})"


def run_state(db: Database, q: LedgerSql, run_id: str) -> str:
    row = db.execute(q.run_state, (run_id,)).fetchone()
    if row is None:
        raise UnknownRecord(f"no run {run_id!r}")
    return row[0]


def unit_status(db: Database, q: LedgerSql, key: UnitKey) -> str:
    row = db.execute(q.unit_status, key).fetchone()
    if row is None:
        raise UnknownRecord(f"no {name(key)}")
    return row[0]


def check_live_attempt(db: Database, q: LedgerSql, key: UnitKey, attempt: int, node: str,
                       status: str) -> tuple[str, bool] | None:
    """Check that `attempt` is live on `node`; returns the unit's status and whether
    other attempts of the unit are live (one query: this runs for every answer), or
    None for an attempt that the end of its run closed (see close_attempts)."""
    row = db.execute(q.live_attempt, (attempt, attempt, *key)).fetchone()
    if row is None:
        raise UnknownRecord(f"no {name(key)}")
    current, owner, attempt_status, others, state = row
    if owner is None:
        raise UnknownRecord(f"{name(key)}: no attempt {attempt}")
    if attempt_status != "in_progress" and state != "running" and owner == node:
        return None
    if attempt_status != "in_progress":
        raise IllegalTransition(f"{name(key)}: attempt {attempt} cannot go from "
                                f"{attempt_status} to {status}; it already ended")
    if owner != node:
        raise ValueError(f"{name(key)}: attempt {attempt} runs on {owner}, not {node}")
    return current, others > 0


def after_attempt(key: UnitKey, current: str, outcome: str, others_live: bool) -> str:
    """The unit's status once one of its attempts ended with `outcome`."""
    if current in SETTLED:
        if outcome in LATE_ENDS:
            return current
        raise IllegalTransition(f"{name(key)}: cannot go from {current} to {outcome}; "
                                "its result came after the unit settled")
    if outcome in ("completed", "discarded") or not others_live:
        return outcome
    return current


def update_unit(db: Database, q: LedgerSql, key: UnitKey, new: str, outcome: str, node: str,
                reason: str | None, now: float) -> None:
    """The unit row after an attempt ended; while the unit stays in_progress it keeps
    the node of its newest attempt."""
    db.execute(q.unit_after_attempt, (new, 1 if outcome in COUNTED_FAILURES else 0,
                                      None if new == "in_progress" else node, reason, now, *key))


def settle(db: Database, q: LedgerSql, run_id: str, round_index: int | None, reason: str,
           now: float) -> int:
    """Cancel every unsettled unit of a run (or one round); live attempts stay open."""
    rows = db.execute(q.unsettled_of, (run_id, round_index, round_index, *UNSETTLED)).fetchall()
    db.executemany(q.cancel_unit, [(reason, now, run_id, r, u) for r, u, _ in rows])
    db.executemany(q.event_insert, [(run_id, r, u, None, None, s, "cancelled", None, reason, now)
                                    for r, u, s in rows])
    return len(rows)


def close_attempts(db: Database, q: LedgerSql, run_id: str, reason: str, now: float) -> int:
    """Close every live attempt of a run as cancelled, its unit left as it is: once the
    run has ended (or its coordinator died) nobody waits for those answers, and an
    attempt left in_progress would look like work still out. Returns how many."""
    rows = db.execute(q.live_attempts_of_run, (run_id,)).fetchall()
    db.executemany(q.cancel_attempt, [(now, reason, run_id, r, u, a) for r, u, a, _, _ in rows])
    db.executemany(q.event_insert, [(run_id, r, u, a, n, s, s, "cancelled", reason, now)
                                    for r, u, a, n, s in rows])
    return len(rows)


def run_record(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(*row[:7], json.loads(row[7]), *row[8:])


def unfinished(row: tuple[Any, ...], mine: list[tuple[str, float]],
               now: float) -> UnfinishedUnit:
    """`mine`: the unit's live attempts as (node, started), oldest attempt first."""
    round_index, unit_id, status, node, updated, attempts, failures, reason = row
    owner, since = mine[-1] if mine else (node, updated)
    return UnfinishedUnit(round=round_index, unit_id=unit_id, status=status, node=owner,
                          age_seconds=max(0.0, now - since), attempts=attempts,
                          live_attempts=len(mine), failures=failures, last_reason=reason)
