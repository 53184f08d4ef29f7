"""A run store on SQLite: runs, rounds, a ledger of work units and per-node counts.

Why: the coordinator keeps a run's state in memory, so a restart forgets every run, and
when a round stalls nobody can say which unit is out, on which node, since when. The
store writes down every unit's status change (the task ledger of todo/pending/done with
failure counts and discard, as in PaddlePaddle's master design), so `client.py status`
can explain a stall, a post-mortem can replay a unit's history, and "nothing lost" is a
count: after a round is recorded, every planned unit is completed, discarded or
cancelled.

Unit life cycle. `plan_units` makes units *pending*. `unit_started` opens an attempt
(numbered per unit within a round) and makes the unit *in_progress*; a unit may hold
several live attempts (backups). `unit_finished` closes one attempt with what it turned
the unit into:

    completed   the result was folded in (the unit is settled)
    failed      the attempt failed; the unit will be retried (a failure is counted)
    stale       the attempt timed out or its node went silent (a failure is counted)
    pending     handed back without a failure (the node rejected it)
    discarded   failed once too often; given up (a failure is counted; settled)
    cancelled   withdrawn for good (settled); a unit still wanted goes back to pending

While other attempts of the unit are live, a failed/stale/pending/cancelled attempt
leaves the unit in_progress. An attempt that ends after its unit settled (the loser of
a backup race, or a straggler after the round ended) is recorded and leaves the unit as
it is; it may end any way but completed, which would count a result twice (report a
result the engine dropped as cancelled). `move_unit` makes the moves that involve no
attempt (requeue, discard, time out, cancel); see MOVES. `record_round` and `end_run`
cancel whatever their round or run left unsettled; `end_run` (and so a restart, which
fails the runs it finds running) also closes the run's live attempts as cancelled, and
an answer that still comes for one of them is ignored. Settled units (completed, discarded,
cancelled) never change again; trying raises IllegalTransition, a ValueError that names
both states.

Threads: one connection shared by every thread of the process, opened with
check_same_thread=False and guarded by a re-entrant lock. SQLite has one writer at a
time anyway, so a connection per thread would only move the waiting into SQLite's busy
handler; with one connection every call is one atomic transaction and no thread of this
process ever sees SQLITE_BUSY. `batch()` groups many calls into one transaction (one
commit) and holds the lock meanwhile. WAL lets other processes read the file while the
coordinator writes; synchronous=NORMAL skips the fsync per commit, so a power cut may
lose the last commits but never corrupts the file.

Errors. A refusal (IllegalTransition, UnknownRecord, ValueError) leaves the file as it
was. When SQLite itself fails (disk full, file read-only, I/O error) the call raises
StoreUnavailable, naming the file and the error: the file no longer says everything that
happened, and callers must not carry on as if it did.

Timestamps are UNIX seconds (float). NaN metrics are stored as NULL and read back as
None (SQLite has no NaN).

This module owns what is SQLite's: the file, its connection, transactions that take the
write lock up front, the schema and its migrations, one version at a time. The ledger
itself (its calls, statements and checks) is coordinator/sql_ledger.py's, shared with the
PostgreSQL store (coordinator/postgres_store.py), a peer that keeps the same ledger on a
server shared by coordinators on several machines.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from thrift_trainer.coordinator.ledger_sql import SQLITE
from thrift_trainer.coordinator.schema_steps import SchemaSteps
from thrift_trainer.coordinator.sql_ledger import SqlLedger
from thrift_trainer.coordinator.sqlite_writes import SqliteWrites
from thrift_trainer.coordinator.store_protocol import Database
from thrift_trainer.coordinator.store_records import (  # noqa: F401 - the store's names, for its callers
    UNIT_STATUSES,
    IllegalTransition,
    NodeRecord,
    RoundRecord,
    RunRecord,
    RunStoreError,
    SchemaError,
    StoreUnavailable,
    UnfinishedUnit,
    UnitEvent,
    UnknownRecord,
)
from thrift_trainer.coordinator.write_behind import Call
from thrift_trainer.engine import runtime

SCHEMA_VERSION = 5
BUSY_TIMEOUT_SECONDS = 5.0
MAX_PAGES_VARIABLE = "TRAINER_STORE_MAX_PAGES"

# the releases a private run's budget is charged (coordinator/ledger_charges.py)
_PRIVACY_CHARGES = """CREATE TABLE privacy_charges (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        charge INTEGER NOT NULL CHECK (charge >= 1),
        round INTEGER NOT NULL,
        epsilon REAL,
        time REAL NOT NULL,
        PRIMARY KEY (run_id, charge))"""

# A run's units per status, kept by triggers as units are planned, move and go, so that
# status (polled twice a second) reads a few rows instead of counting a long run's units
# (SQLite updates a row in place; PostgreSQL counts, see ledger_sql.py).
_UNIT_COUNTS = (
    """CREATE TABLE unit_counts (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        status TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (run_id, status)) WITHOUT ROWID""",
    """CREATE TRIGGER unit_counted AFTER INSERT ON units BEGIN
        INSERT INTO unit_counts VALUES (NEW.run_id, NEW.status, 1)
            ON CONFLICT (run_id, status) DO UPDATE SET n = n + 1;
        END""",
    """CREATE TRIGGER unit_recounted AFTER UPDATE OF status ON units
        WHEN OLD.status <> NEW.status BEGIN
        UPDATE unit_counts SET n = n - 1 WHERE run_id = OLD.run_id AND status = OLD.status;
        INSERT INTO unit_counts VALUES (NEW.run_id, NEW.status, 1)
            ON CONFLICT (run_id, status) DO UPDATE SET n = n + 1;
        END""",
    """CREATE TRIGGER unit_uncounted AFTER DELETE ON units BEGIN
        UPDATE unit_counts SET n = n - 1 WHERE run_id = OLD.run_id AND status = OLD.status;
        END""",
)
_COUNT_EXISTING_UNITS = ("INSERT INTO unit_counts SELECT run_id, status, COUNT(*) FROM units "
                         "GROUP BY run_id, status")

_SCHEMA = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        created REAL NOT NULL,
        state TEXT NOT NULL
            CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
        algorithm TEXT NOT NULL,
        model TEXT NOT NULL,
        dataset TEXT NOT NULL,
        rounds INTEGER NOT NULL,
        config TEXT NOT NULL,
        policy INTEGER,
        message TEXT,
        ended REAL)""",
    "CREATE INDEX runs_by_created ON runs (created)",
    """CREATE TABLE rounds (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        round INTEGER NOT NULL,
        validation_error REAL,
        validation_loss REAL,
        train_loss REAL,
        seconds REAL,
        completed_units INTEGER NOT NULL,
        discarded_units INTEGER NOT NULL,
        ended REAL NOT NULL,
        PRIMARY KEY (run_id, round))""",
    """CREATE TABLE units (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'in_progress', 'completed',
            'failed', 'stale', 'cancelled', 'discarded')),
        node TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        last_reason TEXT,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        pass INTEGER,  -- asynchronous modes: the pass over the data; NULL in sync rounds
        PRIMARY KEY (run_id, round, unit_id)) WITHOUT ROWID""",
    """CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        node TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed',
            'stale', 'pending', 'discarded', 'cancelled')),
        started REAL NOT NULL,
        ended REAL,
        reason TEXT,
        PRIMARY KEY (run_id, round, unit_id, attempt),
        FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)
        WITHOUT ROWID""",
    """CREATE TABLE unit_events (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER,
        node TEXT,
        from_status TEXT,
        to_status TEXT NOT NULL,
        attempt_status TEXT,
        reason TEXT,
        time REAL NOT NULL,
        FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
    "CREATE INDEX unit_events_by_unit ON unit_events (run_id, round, unit_id, id)",
    """CREATE TABLE nodes (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        node TEXT NOT NULL,
        accepted INTEGER NOT NULL DEFAULT 0,
        rejected INTEGER NOT NULL DEFAULT 0,
        delayed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        cancelled INTEGER NOT NULL DEFAULT 0,
        samples INTEGER NOT NULL DEFAULT 0,
        last_answer REAL,
        last_failure REAL,
        last_reason TEXT,
        last_heartbeat REAL,
        PRIMARY KEY (run_id, node))""",
    _PRIVACY_CHARGES,
    *_UNIT_COUNTS,
)

# What each version adds to the one before: a file of an older version takes every step
# after its own, in order, in one transaction; a new file gets _SCHEMA, which is current.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE nodes ADD COLUMN last_heartbeat REAL",),
    3: ("ALTER TABLE units ADD COLUMN pass INTEGER",),
    4: (_PRIVACY_CHARGES,),
    5: (*_UNIT_COUNTS, _COUNT_EXISTING_UNITS),
}
_STEPS = SchemaSteps(SCHEMA_VERSION, _MIGRATIONS, SQLITE.set_schema_version, "file")

# Status queries (`client.py status` polls twice a second) read only the unsettled rows
# through these, instead of every unit and attempt of a long run.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS units_by_status ON units (run_id, status)",
    "CREATE INDEX IF NOT EXISTS attempts_by_status ON attempts (run_id, status)",
)


class RunStore(SqlLedger):
    """The run store in an SQLite file; see the module docstring. Safe to share between
    threads."""

    _q = SQLITE
    _IntegrityError = sqlite3.IntegrityError

    def __init__(self, path: str | os.PathLike[str], *,
                 clock: Callable[[], float] = runtime.wall, defer_writes: bool = False) -> None:
        """``defer_writes``: the engine's hot writes are made behind the run, many in one
        transaction (coordinator/sqlite_writes.py: a coordinator's store); without, every
        call is made when called (tools, and tests of the ledger's semantics)."""
        self.path = os.fspath(path)  # what messages name the store by
        self._start(clock)
        self._deferred = (SqliteWrites(self, self._in_one_transaction) if defer_writes
                          else None)

    def _open(self) -> sqlite3.Connection:
        return _connect(self.path)

    # ------------------------------------------------------------ write-behind
    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._deferred is None:
            return method(self, *args, **kwargs)
        return self._deferred.call(method, *args, **kwargs)

    def _before_read(self) -> None:
        if self._deferred is not None:
            self._deferred.before_read()

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self._deferred is None:
            with self._tx():
                yield
            return
        with self._deferred.batch(), self._tx():
            yield

    def _in_one_transaction(self, calls: list[Call]) -> None:
        """Deferred calls in one transaction, without a savepoint each: a refusal undoes
        the batch, which is then made call by call (coordinator/sqlite_writes.py)."""
        with self._lock:
            self._savepoints = False
            try:
                with self._tx():
                    for method, args, kwargs in calls:
                        method(self, *args, **kwargs)
            finally:
                self._savepoints = True

    def abandon(self) -> None:
        """Drop the connection as a process that dies does, without waiting for the threads
        that use it: what no transaction committed is rolled back by SQLite, and the file
        is free for the next process (a simulated coordinator killed mid-run). Writes still
        queued are lost with it."""
        if getattr(self, "_deferred", None) is not None:
            self._deferred.close(flush=False)
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def close(self) -> None:
        """Make the writes still queued, then close the connection; later calls raise
        RunStoreError. Idempotent."""
        if getattr(self, "_deferred", None) is not None:  # absent if the schema check failed
            self._deferred.close(flush=self._db is not None)
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _begin(self, db: Database, write: bool) -> None:
        """Writers take SQLite's write lock up front (no lock upgrade to fail halfway)."""
        db.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    @contextmanager
    def _unavailable_on_error(self) -> Iterator[None]:
        """SQLite's own errors leave the store as StoreUnavailable; the store's refusals
        (IllegalTransition, UnknownRecord, ValueError) pass unchanged. An IntegrityError
        that gets here is not a refusal either: every expected one is caught inside."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"run store {self.path}: {exc}") from exc

    def _check_schema(self) -> None:
        with self._tx() as db, _opening(self.path):
            tables = {name for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                _create_schema(db)
            else:
                _check_version(self.path, db, tables)
            for statement in _INDEXES:  # idempotent, so older files get them too
                db.execute(statement)


def _connect(path: str) -> sqlite3.Connection:
    with _opening(path):
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None,
                             check_same_thread=False)
    try:
        with _opening(path):
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            _limit_pages(db)
    except BaseException:
        db.close()
        raise
    return db


def _limit_pages(db: sqlite3.Connection) -> None:
    """Fault injection for drills and tests: TRAINER_STORE_MAX_PAGES caps the file's
    size in pages, so writes past it fail as on a full disk (SQLITE_FULL)."""
    limit = os.environ.get(MAX_PAGES_VARIABLE)
    if limit:
        db.execute(f"PRAGMA max_page_count = {int(limit)}")


@contextmanager
def _opening(path: str) -> Iterator[None]:
    """Turn SQLite's errors while opening into ours: a file that is not a database is
    a SchemaError; a busy, locked or unreadable one stays an I/O problem."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise RunStoreError(f"cannot open the run store {path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path} is not a run store: {exc}") from None


def _create_schema(db: Database) -> None:
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute(SQLITE.insert_schema_version, (SCHEMA_VERSION,))


def _check_version(path: str, db: Database, tables: set[str]) -> None:
    if "schema_version" not in tables:
        raise SchemaError(f"{path} is an SQLite database but not a run store (no "
                          f"schema_version table; it holds {', '.join(sorted(tables))})")
    # columns added since an older version: the file gains them
    _STEPS.bring_up_to_date(db, path, db.execute(SQLITE.schema_version).fetchall())
