"""The run store's ledger audited with plain SQL (not the coordinator's own code): every
planned unit accounted for, completed once or discarded with a reason, no attempt left
open, counts that add up, each unit's history replaying to its status; for asynchronous
runs, each round took its results and every earlier pass over the data settled. Used by
the soak (bench/soak.py) and the simulator (devtools/simulation/)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunShape:
    """What a run was asked for, against which its ledger is audited."""

    rounds: int
    units: int  # per round
    mode: str = "sync"  # schedule.mode
    results_per_round: int = 0  # asynchronous modes: results a round takes (0: units)
    # (round, unit) of the federated clients that dropped out of a round, as the run's
    # clients.jsonl says (no live node held them): the store cancels them at its end
    dropped: frozenset[tuple[int, str]] = frozenset()
    # asynchronous modes: units a pass over the data plans (0: units); a stream of client
    # draws (FedBuff) makes each draw a pass of its own, 1
    units_per_pass: int = 0

    @property
    def asynchronous(self) -> bool:
        return self.mode != "sync"


@dataclass
class Check:
    """One audit check: its name, whether it held, and what was found."""

    name: str
    ok: bool
    detail: str


@dataclass
class Ledger:
    checks: list[Check]
    statuses: dict[str, int]
    attempts: dict[str, int]
    discarded_reasons: list[str]
    round_ends: list[float]  # UNIX time each round was recorded, rounds 1..R
    round_units: list[int]  # completed units per round
    run_started: float
    run_ended: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def audit(store: Path | str, run_id: str, s: RunShape) -> Ledger:
    """Read the run store directly (plain SQL, not the coordinator's code) and check that
    every planned unit is accounted for. ``store``: an SQLite file, or a PostgreSQL URL."""
    if isinstance(store, str) and store.startswith(("postgresql://", "postgres://")):
        db = _postgres(store)
    elif not Path(store).is_file():
        return Ledger([Check("run store written", False, f"no file {store}")], {}, {}, [], [],
                      [], 0.0, 0.0)
    else:
        db = sqlite3.connect(store)
    try:
        ledger = _audit(db, run_id, s.rounds, s.units, s.asynchronous, s.dropped)
        if s.asynchronous:
            ledger.checks = [*_stream_checks(db, run_id, s), *ledger.checks]
        return ledger
    finally:
        db.close()


def _postgres(url: str) -> Any:
    """A PostgreSQL connection that takes this module's statements."""
    import psycopg

    return _QmarkConnection(psycopg.connect(url, autocommit=True,
                                            cursor_factory=psycopg.ClientCursor))


class _QmarkConnection:
    """A psycopg connection given this module's statements, written with SQLite's `?`
    (none holds a `?` or a `%` of its own): the audit reads both databases with the same
    plain SQL, not the store's."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def execute(self, sql: str, parameters: Any = None) -> Any:
        return self.connection.execute(sql.replace("?", "%s"), parameters)

    def close(self) -> None:
        self.connection.close()


def _stream_checks(db: sqlite3.Connection, run_id: str, s: RunShape) -> list[Check]:
    """An asynchronous run records a unit in the round whose version took its result, and
    its units in passes over the data: each round took exactly its results, and every pass
    before the newest holds every unit once, completed or discarded (or out on a node when
    the run ended, in its last round)."""
    per_round = _units_per_round(db, run_id)
    results = s.results_per_round or s.units
    wrong = [r for r in range(1, s.rounds + 1)
             if per_round.get(r, {}).get("completed", 0) != results]
    passes: dict[Any, dict[str, int]] = {}
    # A stream of client draws (FedBuff) records each draw's number as its pass; a resumed
    # stream whose state differs from the one before its coordinator died (which clients
    # are out, which nodes hold which) may draw another client under a number already
    # used, so draws are settled unit by unit: each is one "pass" of its own.
    group = "unit_id" if s.units_per_pass == 1 else "pass"
    for pass_index, status, last, n in db.execute(
            f"SELECT {group}, status, round = ?, COUNT(*) FROM units WHERE run_id = ? "
            f"AND pass IS NOT NULL GROUP BY {group}, status, round = ?",
            (s.rounds, run_id, s.rounds)):
        key = "cancelled at the end" if (status, last) == ("cancelled", 1) else status
        counts = passes.setdefault(pass_index, {})
        counts[key] = counts.get(key, 0) + n
    unpassed = db.execute("SELECT COUNT(*) FROM units WHERE run_id = ? AND pass IS NULL",
                          (run_id,)).fetchone()[0]
    if unpassed:
        passes[-1] = {"no pass": unpassed}
    if s.units_per_pass == 1:  # draws: every one settled (the run's end cancels those out)
        full = sorted(p for p in passes if p != -1)
    else:  # the newest pass may still be partial
        full = sorted(p for p in passes if p > 0)[:-1]
    per_pass = s.units_per_pass or s.units
    open_passes = [p for p in full if sum(passes[p].values()) != per_pass or set(passes[p])
                   - {"completed", "discarded", "cancelled at the end"}]
    return [
        Check("each round took its results", not wrong,
              f"{results} completed per round; rounds that differ: {wrong[:5]}"),
        Check("every unit has its pass", -1 not in passes,
              f"{sum(passes.get(-1, {}).values())} units without a pass"),
        Check("every earlier pass settled", not open_passes,
              f"{len(passes)} passes; unsettled or short: "
              f"{[(p, passes[p]) for p in open_passes[:3]]}"),
    ]


def _audit(db: sqlite3.Connection, run_id: str, rounds: int, units: int,
           asynchronous: bool = False,
           dropped_units: frozenset[tuple[int, str]] = frozenset()) -> Ledger:
    def one(sql: str) -> int:
        return db.execute(sql, (run_id,)).fetchone()[0]

    run = db.execute("SELECT state, created, ended, message FROM runs WHERE id = ?",
                     (run_id,)).fetchone()
    if run is None:
        return Ledger([Check("run recorded", False, f"no run {run_id}")], {}, {}, [], [], [], 0, 0)
    state, created, ended, message = run
    recorded = db.execute("SELECT round, completed_units, discarded_units, ended FROM rounds "
                          "WHERE run_id = ? ORDER BY round", (run_id,)).fetchall()
    per_round = _units_per_round(db, run_id)
    statuses = dict(db.execute("SELECT status, COUNT(*) FROM units WHERE run_id = ? "
                               "GROUP BY status", (run_id,)).fetchall())
    attempts = dict(db.execute("SELECT status, COUNT(*) FROM attempts WHERE run_id = ? "
                               "GROUP BY status", (run_id,)).fetchall())
    total = sum(statuses.values())
    settled = statuses.get("completed", 0) + statuses.get("discarded", 0)
    cancelled = set(db.execute("SELECT round, unit_id FROM units WHERE run_id = ? AND "
                               "status = 'cancelled'", (run_id,)).fetchall())
    dropped = len(cancelled & dropped_units)
    wrong_counts = [r for r, done, dropped, _ in recorded
                    if (done, dropped) != (per_round.get(r, {}).get("completed", 0),
                                           per_round.get(r, {}).get("discarded", 0))]
    short = [] if asynchronous else [  # asynchronous rounds: see _stream_checks
        r for r in range(1, rounds + 1) if sum(per_round.get(r, {}).values()) != units]
    # units out on a node when an asynchronous run ended are cancelled, in its last round
    leftovers = per_round.get(rounds, {}).get("cancelled", 0) if asynchronous else 0
    checks = [
        Check("run completed", state == "completed", f"state {state} ({message or 'no message'})"),
        Check("every round recorded", [r[0] for r in recorded] == list(range(1, rounds + 1)),
              f"{len(recorded)} of {rounds} rounds"),
        Check("every planned unit present", asynchronous or total == rounds * units and not short,
              f"{total} units = {rounds} rounds x {units}"
              + (f"; rounds with a wrong count: {short[:5]}" if short else "")),
        Check("every unit completed or discarded", settled + leftovers + dropped == total,
              f"{settled} of {total}; statuses {statuses}"
              + (f"; {leftovers} out when the run ended" if leftovers else "")
              + (f"; {dropped} clients dropped out" if dropped else "")),
        Check("every discard has a reason", one(
            "SELECT COUNT(*) FROM units WHERE run_id = ? AND status = 'discarded' "
            "AND (last_reason IS NULL OR last_reason = '')") == 0,
            f"{statuses.get('discarded', 0)} discarded"),
        Check("round counts match the units", not wrong_counts,
              f"rounds whose completed/discarded counts differ: {wrong_counts[:5]}"),
        Check("one completed attempt per completed unit", one(
            "SELECT COUNT(*) FROM units u WHERE run_id = ? AND (SELECT COUNT(*) FROM attempts a "
            "WHERE a.run_id = u.run_id AND a.round = u.round AND a.unit_id = u.unit_id AND "
            "a.status = 'completed') != CASE WHEN u.status = 'completed' THEN 1 ELSE 0 END")
        == 0,
            "units whose completed attempts are not 1 (completed) or 0 (discarded)"),
        Check("no attempt left open", attempts.get("in_progress", 0) == 0,
              f"{attempts.get('in_progress', 0)} attempts still in_progress"),
        Check("attempt counts match", one(
            "SELECT COUNT(*) FROM units u WHERE run_id = ? AND u.attempts != (SELECT COUNT(*) "
            "FROM attempts a WHERE a.run_id = u.run_id AND a.round = u.round AND "
            "a.unit_id = u.unit_id)") == 0, "units whose attempt count differs from the rows"),
        Check("history replays to the status", one(
            "SELECT COUNT(*) FROM units u WHERE run_id = ? AND u.status != (SELECT e.to_status "
            "FROM unit_events e WHERE e.run_id = u.run_id AND e.round = u.round AND "
            "e.unit_id = u.unit_id ORDER BY e.id DESC LIMIT 1)") == 0,
            "units whose last event differs from their status"),
    ]
    reasons = [f"round {r} {u}: {why}" for r, u, why in db.execute(
        "SELECT round, unit_id, last_reason FROM units WHERE run_id = ? AND status = 'discarded' "
        "ORDER BY round LIMIT 10", (run_id,))]
    return Ledger(checks, statuses, attempts, reasons, [r[3] for r in recorded],
                  [r[1] for r in recorded], created, ended or time.time())


def _units_per_round(db: sqlite3.Connection, run_id: str) -> dict[int, dict[str, int]]:
    counts: dict[int, dict[str, int]] = {}
    for round_index, status, n in db.execute("SELECT round, status, COUNT(*) FROM units "
                                             "WHERE run_id = ? GROUP BY round, status", (run_id,)):
        counts.setdefault(round_index, {})[status] = n
    return counts
