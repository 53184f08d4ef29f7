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

The same ledger runs on PostgreSQL (coordinator/postgres_store.py), shared by coordinators
on several machines; this module's statements are written to run on both.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol

from engine import runtime
from engine.ledger import RunStoreError, StoreUnavailable
from engine.records import NodeCounts

SCHEMA_VERSION = 3  # 2: nodes.last_heartbeat; 3: units.pass
RUN_STATES = ("running", "completed", "failed", "cancelled")
END_STATES = frozenset(RUN_STATES[1:])
UNIT_STATUSES = ("pending", "in_progress", "completed", "failed", "stale", "cancelled",
                 "discarded")
SETTLED = frozenset({"completed", "discarded", "cancelled"})
UNSETTLED = tuple(s for s in UNIT_STATUSES if s not in SETTLED)
STARTABLE = frozenset({"pending", "in_progress", "failed", "stale"})
ATTEMPT_ENDS = frozenset({"completed", "failed", "stale", "pending", "discarded", "cancelled"})
LATE_ENDS = ATTEMPT_ENDS - {"completed"}  # an attempt ending after its unit settled
COUNTED_FAILURES = frozenset({"failed", "stale", "discarded"})
MOVES: Mapping[str, frozenset[str]] = {  # move_unit: unit-level moves without an attempt
    "pending": frozenset({"cancelled", "discarded"}),
    "failed": frozenset({"pending", "cancelled", "discarded"}),
    "stale": frozenset({"pending", "cancelled", "discarded"}),
    "in_progress": frozenset({"stale", "cancelled"}),  # live attempts may still answer
}
NODE_OUTCOMES = frozenset({"completed", "rejected", "cancelled"})
MAX_UNITS_PER_CALL = 100_000
MAX_LIST = 10_000
BUSY_TIMEOUT_SECONDS = 5.0
MAX_PAGES_VARIABLE = "TRAINER_STORE_MAX_PAGES"

UnitKey = tuple[str, int, str]  # (run_id, round, unit_id)

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
)

_ADD_PASS = "ALTER TABLE units ADD COLUMN pass INTEGER"
_MIGRATIONS = {  # a file of an older schema version -> what brings it to SCHEMA_VERSION
    1: ("ALTER TABLE nodes ADD COLUMN last_heartbeat REAL", _ADD_PASS),
    2: (_ADD_PASS,),
}

# Status queries (`client.py status` polls twice a second) read only the unsettled rows
# through these, instead of every unit and attempt of a long run.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS units_by_status ON units (run_id, status)",
    "CREATE INDEX IF NOT EXISTS attempts_by_status ON attempts (run_id, status)",
)
_RUN_COLUMNS = ("id, created, state, algorithm, model, dataset, rounds, config, policy, "
                "message, ended, (SELECT COUNT(*) FROM rounds WHERE run_id = runs.id)")
_EVENT_INSERT = ("INSERT INTO unit_events (run_id, round, unit_id, attempt, node, from_status, "
                 "to_status, attempt_status, reason, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_UNIT_WHERE = "run_id = ? AND round = ? AND unit_id = ?"
_NODE_UPSERT = """INSERT INTO nodes (run_id, node, accepted, rejected, delayed, failed,
        cancelled, samples, last_answer, last_failure, last_reason)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (run_id, node) DO UPDATE SET
        accepted = nodes.accepted + excluded.accepted,
        rejected = nodes.rejected + excluded.rejected,
        delayed = nodes.delayed + excluded.delayed, failed = nodes.failed + excluded.failed,
        cancelled = nodes.cancelled + excluded.cancelled,
        samples = nodes.samples + excluded.samples,
        last_answer = COALESCE(excluded.last_answer, nodes.last_answer),
        last_failure = COALESCE(excluded.last_failure, nodes.last_failure),
        last_reason = COALESCE(excluded.last_reason, nodes.last_reason)"""
_NODE_RECORD_COLUMNS = ("node", "accepted", "rejected", "delayed", "failed", "cancelled", "samples",
                        "last_answer", "last_failure", "last_reason", "last_heartbeat")


class Database(Protocol):
    """What the store's SQL runs on: an sqlite3 connection, or coordinator/postgres_store.py's
    session, which takes the same statements."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


class SchemaError(RunStoreError):
    """The file is not a run store, or holds a schema this code does not know."""


class UnknownRecord(RunStoreError, LookupError):
    """No such run, unit or attempt."""


class IllegalTransition(RunStoreError, ValueError):
    """A status change the life cycle forbids; the message names both states."""


@dataclass(frozen=True)
class RunRecord:
    """One run as `client.py runs` lists it; config is the decoded JSON."""

    run_id: str
    created: float
    state: str
    algorithm: str
    model: str
    dataset: str
    rounds: int
    config: dict[str, Any]
    policy: int | None
    message: str | None
    ended: float | None
    rounds_done: int


@dataclass(frozen=True)
class RoundRecord:
    """A finished round's metrics (NaN reads back as None)."""

    round: int
    validation_error: float | None
    validation_loss: float | None
    train_loss: float | None
    seconds: float | None
    completed_units: int
    discarded_units: int
    ended: float


@dataclass(frozen=True)
class UnitEvent:
    """One status change of a unit: replaying them gives its history."""

    round: int
    unit_id: str
    attempt: int | None
    node: str | None
    from_status: str | None  # None for the event that planned the unit
    to_status: str
    attempt_status: str | None  # the attempt's own status; None for unit-level moves
    reason: str | None
    time: float


@dataclass(frozen=True)
class UnfinishedUnit:
    """What `client.py status` shows so that a stall explains itself."""

    round: int
    unit_id: str
    status: str
    node: str | None  # owner: the newest live attempt's node, else the last node that held it
    age_seconds: float  # since the owner started it, else since the last status change
    attempts: int
    live_attempts: int
    failures: int
    last_reason: str | None


@dataclass(kw_only=True)
class NodeRecord(NodeCounts):
    """A node's counts within one run, as in the client's summary table. The store keeps
    answers and samples, not seconds: those read 0."""

    node: str
    last_answer: float | None
    last_failure: float | None
    last_reason: str | None
    last_heartbeat: float | None = None


def rides_out_outages(method: Callable[..., Any]) -> Callable[..., Any]:
    """A call the engine makes while it trains: a store on a database server (PostgreSQL)
    may make it later, in a batch, and makes it again, whole, while the database is away
    (see PostgresRunStore._call); the SQLite store just makes it."""
    @functools.wraps(method)
    def call(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        return self._call(method, *args, **kwargs)
    return call


def reads_what_was_written(method: Callable[..., Any]) -> Callable[..., Any]:
    """A query: a store that makes writes later (PostgreSQL's) makes them first."""
    @functools.wraps(method)
    def read(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        self._before_read()
        return method(self, *args, **kwargs)
    return read


class RunStore:
    """The run store; see the module docstring. Safe to share between threads.
    coordinator/postgres_store.py's PostgresRunStore is this with another database under it:
    it overrides the plumbing (connecting, beginning a transaction, the schema check) and
    the driver's error classes below."""

    _DriverError: type[Exception] = sqlite3.Error
    _IntegrityError: type[Exception] = sqlite3.IntegrityError
    keeps_files = False  # a run's files are in its folder only (PostgreSQL keeps them too)
    keeps_results = False  # units' results are not kept (see coordinator/kept_results.py)

    def __init__(self, path: str | os.PathLike[str], *,
                 clock: Callable[[], float] = runtime.wall) -> None:
        self.path = os.fspath(path)  # what messages name the store by
        self._start(clock)

    def _start(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = runtime.RLock()
        self._depth = 0  # transactions opened by the thread holding the lock
        # nested calls get savepoints; PostgreSQL's batched writes go without (one failing
        # call fails the batch, whose calls are then made one by one)
        self._savepoints = True
        self._db: Database | None = self._open()
        try:
            self._check_schema()
        except BaseException:
            self.close()
            raise

    def _open(self) -> Database:
        return _connect(self.path)

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return method(self, *args, **kwargs)

    def _before_read(self) -> None:
        """Nothing: every write of this store is made when called."""

    # --------------------------------------------------------------- plumbing
    def abandon(self) -> None:
        """Drop the connection as a process that dies does, without waiting for the threads
        that use it: what no transaction committed is rolled back by SQLite, and the file
        is free for the next process (a simulated coordinator killed mid-run)."""
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def close(self) -> None:
        """Close the connection; later calls raise RunStoreError. Idempotent."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run many calls as one transaction: one commit instead of one per call, and
        all or nothing. Other threads wait until the block ends."""
        with self._tx():
            yield

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Database]:
        """One transaction under the lock; nested calls become savepoints, so a failing
        call inside batch() undoes only itself. Writers take SQLite's write lock up
        front (no lock upgrade to fail halfway); readers only read a snapshot."""
        with self._lock, self._unavailable_on_error():
            db = self._connection()
            outer = self._depth == 0
            own = outer or self._savepoints  # a transaction or savepoint of its own
            if outer:
                self._begin(db, write)
            elif own:
                db.execute("SAVEPOINT nested")
            self._depth += 1
            try:
                yield db
            except BaseException:
                self._depth -= 1
                if own:
                    _undo(db, outer)
                raise
            self._depth -= 1
            if own:
                _commit(db, outer)

    @contextmanager
    def _unavailable_on_error(self) -> Iterator[None]:
        """SQLite's own errors leave the store as StoreUnavailable; the store's refusals
        (IllegalTransition, UnknownRecord, ValueError) pass unchanged. An IntegrityError
        that gets here is not a refusal either: every expected one is caught inside."""
        try:
            yield
        except self._DriverError as exc:
            raise StoreUnavailable(f"run store {self.path}: {exc}") from exc

    def _begin(self, db: Database, write: bool) -> None:
        db.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _connection(self) -> Database:
        if self._db is None:
            raise RunStoreError(f"the run store {self.path} is closed")
        return self._db

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

    # ------------------------------------------------------------------- runs
    @rides_out_outages
    def create_run(self, run_id: str, *, algorithm: str, model: str, dataset: str,
                   rounds: int, config: Mapping[str, Any] | None = None,
                   policy: int | None = None) -> None:
        """Record a new run, state running; ValueError if the id is taken."""
        _check_text("run id", run_id)
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        config_json = json.dumps(dict(config or {}), sort_keys=True)
        with self._tx() as db:
            try:
                db.execute("INSERT INTO runs (id, created, state, algorithm, model, dataset, "
                           "rounds, config, policy) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                           (run_id, self._clock(), algorithm, model, dataset, rounds,
                            config_json, policy))
            except self._IntegrityError:
                raise ValueError(f"run {run_id!r} already exists") from None

    @rides_out_outages
    def end_run(self, run_id: str, state: str, message: str | None = None) -> int:
        """End a running run; its unsettled units become cancelled (returns how many),
        so that every planned unit of an ended run is accounted for."""
        if state not in END_STATES:
            raise ValueError(f"a run ends as one of {sorted(END_STATES)}, not {state!r}")
        with self._tx() as db:
            return self._end_run(db, run_id, state, message, self._clock())

    @rides_out_outages
    def fail_unfinished_runs(self, message: str = "the coordinator restarted") -> list[str]:
        """At start-up: runs still `running` in the file were cut off by a crash or a
        restart; mark them failed so no reader waits on them. Returns their ids."""
        now = self._clock()
        with self._tx() as db:
            ids = [i for (i,) in db.execute("SELECT id FROM runs WHERE state = 'running' "
                                            "ORDER BY created LIMIT ?", (MAX_LIST,))]
            for run_id in ids:
                self._end_run(db, run_id, "failed", message, now)
        return ids

    @rides_out_outages
    def resume_run(self, run_id: str, from_round: int, rounds: int | None = None) -> int:
        """Take an ended run up again after its round `from_round` (its checkpoint).

        The run is running again; rounds after `from_round` lose their metrics and their
        units go back to pending (an event says why): results of those rounds died with
        the coordinator and were never applied to the checkpoint's weights, so they are
        done again, once, and the attempts that had brought them are stale. This is the
        one move out of a settled status. A store that keeps results (coordinator/
        kept_results.py) leaves completed the units of round ``from_round + 1`` whose
        result it holds: they were computed from the checkpoint's weights and are used
        as they are. ``rounds``: the run's new length when it is extended, the only way
        to take up a completed run.
        Returns how many units were reopened."""
        now = self._clock()
        reason = f"reopened: the run resumed from its checkpoint of round {from_round}"
        with self._tx() as db:
            state = _run_state(db, run_id)
            if state == "running" or (state == "completed" and rounds is None):
                raise IllegalTransition(f"run {run_id} is {state}: it cannot be resumed"
                                        + (" (extend it with more rounds)"
                                           if state == "completed" else ""))
            if rounds is not None:
                db.execute("UPDATE runs SET rounds = ? WHERE id = ?", (rounds, run_id))
            db.execute("UPDATE runs SET state = 'running', message = NULL, ended = NULL "
                       "WHERE id = ?", (run_id,))
            _close_attempts(db, run_id, "the coordinator stopped before it answered", now)
            kept = self._results_kept(db, run_id, from_round + 1)
            # the results those attempts brought died with the coordinator: never applied
            lost = [(r, u, a) for r, u, a in db.execute(
                "SELECT round, unit_id, attempt FROM attempts WHERE run_id = ? AND round > ? "
                "AND status = 'completed'", (run_id, from_round)) if (r, u) not in kept]
            db.executemany(f"UPDATE attempts SET status = 'stale', reason = ? WHERE "
                           f"{_UNIT_WHERE} AND attempt = ?",
                           [(f"its result was lost with the coordinator ({reason})", run_id,
                             r, u, a) for r, u, a in lost])
            db.execute("DELETE FROM rounds WHERE run_id = ? AND round > ?", (run_id, from_round))
            rows = [(r, u, s) for r, u, s in db.execute(
                "SELECT round, unit_id, status FROM units WHERE run_id = ? AND round > ?",
                (run_id, from_round)) if (r, u) not in kept]
            db.executemany(f"UPDATE units SET status = 'pending', failures = 0, last_reason = ?, "
                           f"updated = ? WHERE {_UNIT_WHERE}",
                           [(reason, now, run_id, r, u) for r, u, _ in rows])
            db.executemany(_EVENT_INSERT, [(run_id, r, u, None, None, s, "pending", None, reason,
                                            now) for r, u, s in rows])
            return len(rows)

    @rides_out_outages
    def gather_units(self, run_id: str, after_round: int, into_round: int,
                     reason: str) -> int:
        """Move every unsettled unit of the rounds after ``after_round`` (with its attempts
        and events) into round ``into_round``; returns how many moved.

        The asynchronous modes record a unit in the round whose version took its result:
        at a round's end the units still waiting or computing go on into the next round,
        and a resume gathers the units it reopened into the round it starts with."""
        now = self._clock()
        with self._tx() as db:
            _run_state(db, run_id)
            rows = db.execute(
                "SELECT round, unit_id, status FROM units WHERE run_id = ? AND round > ? AND "
                f"round != ? AND status IN ({', '.join('?' * len(UNSETTLED))})",
                (run_id, after_round, into_round, *UNSETTLED)).fetchall()
            for round_index, unit_id, status in rows:
                _move_unit_row(db, (run_id, round_index, unit_id), into_round)
                db.execute(_EVENT_INSERT, (run_id, into_round, unit_id, None, None, status,
                                           status, None, reason, now))
            return len(rows)

    @rides_out_outages
    def attempts_so_far(self, run_id: str, round_index: int) -> dict[str, int]:
        """Attempts already numbered per unit of a round (a reopened round has some), so
        new attempts continue the numbering."""
        with self._tx(write=False) as db:
            return dict(db.execute("SELECT unit_id, attempts FROM units WHERE run_id = ? AND "
                                   "round = ? AND attempts > 0", (run_id, round_index)))

    def _results_kept(self, db: Database, run_id: str, round_index: int) -> set[tuple[int, str]]:
        """(round, unit) of the units of ``round_index`` completed with a kept result (none
        here); a store that keeps results also forgets the run's other ones (a resume)."""
        return set()

    def _end_run(self, db: Database, run_id: str, state: str,
                 message: str | None, now: float) -> int:
        current = _run_state(db, run_id)
        if current != "running":
            raise IllegalTransition(f"run {run_id}: cannot go from {current} to {state}")
        withdrawn = _settle(db, run_id, None, message or f"run {state}", now)
        _close_attempts(db, run_id, message or f"run {state}", now)
        db.execute("UPDATE runs SET state = ?, message = ?, ended = ? WHERE id = ?",
                   (state, message, now, run_id))
        return withdrawn

    @rides_out_outages
    def record_round(self, run_id: str, round_index: int, *, validation_error: float,
                     validation_loss: float, train_loss: float, seconds: float,
                     completed_units: int, discarded_units: int) -> int:
        """Record a finished round's metrics. Its unsettled units (those the quorum did
        not wait for) become cancelled in the same transaction; returns how many."""
        now = self._clock()
        with self._tx() as db:
            _run_state(db, run_id)
            try:
                db.execute("INSERT INTO rounds (run_id, round, validation_error, validation_loss, "
                           "train_loss, seconds, completed_units, discarded_units, ended) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (run_id, round_index, *map(null_if_nan, (
                               validation_error, validation_loss, train_loss, seconds)),
                            completed_units, discarded_units, now))
            except self._IntegrityError:
                raise ValueError(f"round {round_index} of run {run_id} is already "
                                 "recorded") from None
            return _settle(db, run_id, round_index, "round ended", now)

    # ------------------------------------------------------------------ units
    @rides_out_outages
    def plan_units(self, run_id: str, round_index: int, unit_ids: Iterable[str],
                   adopt: bool = False, pass_index: int | None = None) -> int:
        """Add a round's units as pending, all in one transaction; returns how many.
        ``adopt``: units the round already holds unsettled (reopened by a resume and
        gathered there) are taken as they are instead of refused. ``pass_index``: the
        pass over the data the units belong to (asynchronous modes)."""
        if round_index < 1:
            raise ValueError(f"rounds are numbered from 1, got {round_index}")
        ids = _check_unit_ids(unit_ids)
        now = self._clock()
        with self._tx() as db:
            state = _run_state(db, run_id)
            if state != "running":
                raise IllegalTransition(f"run {run_id} is {state}: cannot plan units")
            ids = _check_new_units(db, run_id, round_index, ids, adopt)
            db.executemany("INSERT INTO units (run_id, round, unit_id, status, created, updated, "
                           "pass) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                           [(run_id, round_index, u, now, now, pass_index) for u in ids])
            db.executemany(_EVENT_INSERT, [(run_id, round_index, u, None, None, None, "pending",
                                            None, None, now) for u in ids])
        return len(ids)

    @rides_out_outages
    def unit_started(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                     node: str) -> None:
        """Open attempt `attempt` of a unit on `node`; the unit becomes in_progress."""
        _check_text("node", node)
        if attempt < 1:
            raise ValueError(f"attempts are numbered from 1, got {attempt}")
        key = (run_id, round_index, unit_id)
        now = self._clock()
        with self._tx() as db:
            current = _unit_status(db, key)
            if current not in STARTABLE:
                raise IllegalTransition(f"{_name(key)}: cannot go from {current} to in_progress")
            try:
                db.execute("INSERT INTO attempts (run_id, round, unit_id, attempt, node, status, "
                           "started) VALUES (?, ?, ?, ?, ?, 'in_progress', ?)",
                           (*key, attempt, node, now))
            except self._IntegrityError:
                raise ValueError(f"{_name(key)}: attempt {attempt} was already "
                                 "started") from None
            db.execute(f"UPDATE units SET status = 'in_progress', node = ?, "
                       f"attempts = attempts + 1, updated = ? WHERE {_UNIT_WHERE}",
                       (node, now, *key))
            db.execute(_EVENT_INSERT, (*key, attempt, node, current, "in_progress",
                                       "in_progress", None, now))

    @rides_out_outages
    def unit_finished(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                      node: str, status: str, reason: str | None = None) -> str:
        """Close a live attempt with `status` (see the module docstring); returns the
        unit's new status. IllegalTransition if the unit cannot take it."""
        if status not in ATTEMPT_ENDS:
            raise ValueError(f"an attempt ends as one of {sorted(ATTEMPT_ENDS)}, "
                             f"not {status!r}")
        key = (run_id, round_index, unit_id)
        now = self._clock()
        with self._tx() as db:
            live = _check_live_attempt(db, key, attempt, node, status)
            if live is None:  # closed when its run ended: nobody waits for this answer
                return _unit_status(db, key)
            current, others_live = live
            new = _after_attempt(key, current, status, others_live)
            db.execute(f"UPDATE attempts SET status = ?, ended = ?, reason = ? "
                       f"WHERE {_UNIT_WHERE} AND attempt = ?", (status, now, reason, *key, attempt))
            if current not in SETTLED:  # a late attempt leaves its settled unit alone
                _update_unit(db, key, new, status, node, reason, now)
            db.execute(_EVENT_INSERT, (*key, attempt, node, current, new, status, reason, now))
        return new

    @rides_out_outages
    def move_unit(self, run_id: str, round_index: int, unit_id: str, status: str,
                  reason: str | None = None) -> None:
        """A move that involves no attempt: requeue, discard, time out or cancel a unit
        (see MOVES). Moving an in_progress unit leaves its attempts open: they may still
        answer, and record their end with unit_finished."""
        if status not in UNIT_STATUSES:
            raise ValueError(f"unknown unit status {status!r}; one of {list(UNIT_STATUSES)}")
        key = (run_id, round_index, unit_id)
        now = self._clock()
        with self._tx() as db:
            current = _unit_status(db, key)
            if status not in MOVES.get(current, frozenset()):
                raise IllegalTransition(f"{_name(key)}: cannot go from {current} to {status}")
            db.execute(f"UPDATE units SET status = ?, failures = failures + ?, "
                       f"last_reason = COALESCE(?, last_reason), updated = ? WHERE {_UNIT_WHERE}",
                       (status, 1 if status == "stale" else 0, reason, now, *key))
            db.execute(_EVENT_INSERT, (*key, None, None, current, status, None, reason, now))

    # ------------------------------------------------------------------ nodes
    @rides_out_outages
    def node_answer(self, run_id: str, node: str, outcome: str, delayed: bool,
                    samples: int = 0) -> None:
        """Count a node's answer as NodeHandle.finished does: a rejection is only a
        rejection; otherwise delayed counts on top of accepted or cancelled."""
        if outcome not in NODE_OUTCOMES:
            raise ValueError(f"a node answers one of {sorted(NODE_OUTCOMES)}, not {outcome!r}")
        if samples < 0:
            raise ValueError(f"samples cannot be negative, got {samples}")
        rejected = outcome == "rejected"
        counts = (0 if rejected or outcome == "cancelled" else 1, int(rejected),
                  int(delayed and not rejected), 0, int(outcome == "cancelled"),
                  samples if outcome == "completed" else 0)
        self._node_upsert(run_id, node, counts, (self._clock(), None, None))

    @rides_out_outages
    def node_failure(self, run_id: str, node: str, reason: str | None = None) -> None:
        """Count a call that failed (no answer, transport error, invalid request)."""
        self._node_upsert(run_id, node, (0, 0, 0, 1, 0, 0), (None, self._clock(), reason))

    @rides_out_outages
    def node_heartbeats(self, run_id: str, heard: Mapping[str, float]) -> None:
        """When each node was last heard from (UNIX seconds), in one transaction."""
        with self._tx() as db:
            for node, when in heard.items():
                _check_text("node", node)
                db.execute("INSERT INTO nodes (run_id, node, last_heartbeat) VALUES (?, ?, ?) "
                           "ON CONFLICT (run_id, node) DO UPDATE SET "
                           "last_heartbeat = excluded.last_heartbeat", (run_id, node, when))

    def _node_upsert(self, run_id: str, node: str, counts: tuple[int, ...],
                     times: tuple[float | None, float | None, str | None]) -> None:
        _check_text("node", node)
        with self._tx() as db:
            try:
                db.execute(_NODE_UPSERT, (run_id, node, *counts, *times))
            except self._IntegrityError:
                raise UnknownRecord(f"no run {run_id!r}") from None

    # ---------------------------------------------------------------- queries
    @reads_what_was_written
    def get_run(self, run_id: str) -> RunRecord | None:
        """One run, or None if the store has no such run."""
        with self._tx(write=False) as db:
            row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?",
                             (run_id,)).fetchone()
        return None if row is None else _run_record(row)

    @reads_what_was_written
    def list_runs(self, limit: int = 20) -> list[RunRecord]:
        """The newest runs first (by creation time, then by insertion), at most `limit`."""
        if not 1 <= limit <= MAX_LIST:
            raise ValueError(f"limit must be between 1 and {MAX_LIST}, got {limit}")
        with self._tx(write=False) as db:
            rows = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs "
                              "ORDER BY created DESC, rowid DESC LIMIT ?", (limit,)).fetchall()
        return [_run_record(row) for row in rows]

    @reads_what_was_written
    def list_rounds(self, run_id: str) -> list[RoundRecord]:
        """The recorded rounds of a run, in order."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT round, validation_error, validation_loss, train_loss, "
                              "seconds, completed_units, discarded_units, ended FROM rounds "
                              "WHERE run_id = ? ORDER BY round", (run_id,)).fetchall()
        return [RoundRecord(*row) for row in rows]

    @reads_what_was_written
    def unfinished_units(self, run_id: str) -> list[UnfinishedUnit]:
        """Every unit not yet settled, the longest-waiting first, with its owner node,
        age and attempts: what a stalled round is waiting for."""
        now = self._clock()
        with self._tx(write=False) as db:
            units = db.execute(
                "SELECT round, unit_id, status, node, updated, attempts, failures, last_reason "
                "FROM units INDEXED BY units_by_status WHERE run_id = ? "
                "AND status IN (?, ?, ?, ?)",
                (run_id, *UNSETTLED)).fetchall()
            live = db.execute("SELECT round, unit_id, node, started FROM attempts INDEXED BY "
                              "attempts_by_status WHERE run_id = ? AND status = 'in_progress' "
                              "ORDER BY attempt",
                              (run_id,)).fetchall()
        owners: dict[tuple[int, str], list[tuple[str, float]]] = {}
        for round_index, unit_id, node, started in live:
            owners.setdefault((round_index, unit_id), []).append((node, started))
        result = [_unfinished(row, owners.get((row[0], row[1]), []), now) for row in units]
        return sorted(result, key=lambda u: (-u.age_seconds, u.round, u.unit_id))

    @reads_what_was_written
    def unit_history(self, run_id: str, round_index: int, unit_id: str) -> list[UnitEvent]:
        """Every status change of one unit, oldest first, to replay what happened."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT round, unit_id, attempt, node, from_status, to_status, "
                              "attempt_status, reason, time FROM unit_events "
                              f"WHERE {_UNIT_WHERE} ORDER BY id",
                              (run_id, round_index, unit_id)).fetchall()
        return [UnitEvent(*row) for row in rows]

    @reads_what_was_written
    def ledger_counts(self, run_id: str, round_index: int | None = None) -> dict[str, int]:
        """Units per status (every status present, zeros included) for a run or one
        round: their sum is the number planned, so "nothing lost" is a count."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT status, COUNT(*) FROM units WHERE run_id = ? "
                              "AND (CAST(? AS INTEGER) IS NULL OR round = ?) GROUP BY status",
                              (run_id, round_index, round_index)).fetchall()
        counts = dict.fromkeys(UNIT_STATUSES, 0)
        counts.update(dict(rows))
        return counts

    @reads_what_was_written
    def pass_counts(self, run_id: str) -> dict[int, dict[str, int]]:
        """Units per pass and status of an asynchronous run (units enter the store when
        first sent, so a pass holds the units sent so far)."""
        counts: dict[int, dict[str, int]] = {}
        with self._tx(write=False) as db:
            for pass_index, status, n in db.execute(
                    "SELECT pass, status, COUNT(*) FROM units WHERE run_id = ? AND pass IS NOT "
                    "NULL GROUP BY pass, status", (run_id,)):
                counts.setdefault(pass_index, {})[status] = n
        return counts

    @reads_what_was_written
    def node_stats(self, run_id: str) -> list[NodeRecord]:
        """Per-node counts of a run, by node name."""
        with self._tx(write=False) as db:
            rows = db.execute(f"SELECT {', '.join(_NODE_RECORD_COLUMNS)} FROM nodes "
                              "WHERE run_id = ? ORDER BY node", (run_id,)).fetchall()
        return [NodeRecord(**dict(zip(_NODE_RECORD_COLUMNS, row, strict=True))) for row in rows]


# ------------------------------------------------------------------ helpers
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
    db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))


def _check_version(path: str, db: Database, tables: set[str]) -> None:
    if "schema_version" not in tables:
        raise SchemaError(f"{path} is an SQLite database but not a run store (no "
                          f"schema_version table; it holds {', '.join(sorted(tables))})")
    rows = db.execute("SELECT version FROM schema_version LIMIT 2").fetchall()
    version = rows[0][0] if len(rows) == 1 else None
    if version == SCHEMA_VERSION:
        return
    if version in _MIGRATIONS:  # columns added since: the file gains them
        for statement in _MIGRATIONS[version]:
            db.execute(statement)
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        return
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise SchemaError(f"{path} has run store schema version {version}, newer than this "
                          f"coordinator understands ({SCHEMA_VERSION}): use a newer "
                          "coordinator or another file")
    raise SchemaError(f"{path} has an unknown run store schema version "
                      f"{[r[0] for r in rows]!r} (expected {SCHEMA_VERSION})")


def _undo(db: Database, outer: bool) -> None:
    if not db.in_transaction:  # SQLite rolled back by itself (disk full, I/O error)
        return
    if outer:
        db.execute("ROLLBACK")
    else:
        db.execute("ROLLBACK TO nested")
        db.execute("RELEASE nested")


def _commit(db: Database, outer: bool) -> None:
    try:
        db.execute("COMMIT" if outer else "RELEASE nested")
    except BaseException:
        if outer and db.in_transaction:
            db.execute("ROLLBACK")
        raise


def null_if_nan(value: float) -> float | None:
    """NaN is stored as NULL: SQLite does so by itself, PostgreSQL would keep the NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _check_text(what: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


def _check_unit_ids(unit_ids: Iterable[str]) -> list[str]:
    ids = list(islice(unit_ids, MAX_UNITS_PER_CALL + 1))
    if len(ids) > MAX_UNITS_PER_CALL:
        raise ValueError(f"at most {MAX_UNITS_PER_CALL} units per call")
    for unit_id in ids:
        _check_text("unit id", unit_id)
    repeated = sorted(u for u, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ValueError(f"unit ids repeated: {', '.join(repeated[:5])}")
    return ids


def _check_new_units(db: Database, run_id: str, round_index: int,
                     ids: list[str], adopt: bool = False) -> list[str]:
    """The ids to insert: a reopened round (see resume_run) plans again exactly the
    units it has, all pending; with ``adopt``, units the round holds unsettled are
    left as they are; any other clash is an error."""
    existing = dict(db.execute("SELECT unit_id, status FROM units WHERE run_id = ? AND "
                               "round = ?", (run_id, round_index)))
    if existing and set(existing) == set(ids) and _reopened(db, run_id, round_index, existing,
                                                            kept_allowed=not adopt):
        return []
    if adopt:
        ids = [u for u in ids if existing.get(u) not in UNSETTLED]
    clash = sorted(set(existing).intersection(ids))
    if clash:
        raise ValueError(f"round {round_index} of run {run_id} already has units "
                         f"{', '.join(clash[:5])}")
    return ids


def _reopened(db: Database, run_id: str, round_index: int, existing: dict[str, str],
              kept_allowed: bool) -> bool:
    """Whether a round's units are as a resume left them: pending, or (``kept_allowed``,
    a round, not a stream's) completed with a result kept from before (see resume_run),
    in a round not recorded yet."""
    statuses = set(existing.values())
    if statuses == {"pending"}:
        return True
    return kept_allowed and statuses <= {"pending", "completed"} and db.execute(
        "SELECT 1 FROM rounds WHERE run_id = ? AND round = ?",
        (run_id, round_index)).fetchone() is None


def _move_unit_row(db: Database, key: UnitKey, into_round: int) -> None:
    """Re-key a unit row, its attempts and events to ``into_round``: the new row first,
    its children next, the old row last, so no foreign key ever points nowhere."""
    db.execute("INSERT INTO units (run_id, round, unit_id, status, node, attempts, failures, "
               "last_reason, created, updated, pass) SELECT run_id, ?, unit_id, status, node, "
               f"attempts, failures, last_reason, created, updated, pass FROM units "
               f"WHERE {_UNIT_WHERE}", (into_round, *key))
    for table in ("attempts", "unit_events"):
        db.execute(f"UPDATE {table} SET round = ? WHERE {_UNIT_WHERE}", (into_round, *key))
    db.execute(f"DELETE FROM units WHERE {_UNIT_WHERE}", key)


def _name(key: UnitKey) -> str:
    return f"unit {key[2]} (run {key[0]}, round {key[1]})"


def _run_state(db: Database, run_id: str) -> str:
    row = db.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise UnknownRecord(f"no run {run_id!r}")
    return row[0]


def _unit_status(db: Database, key: UnitKey) -> str:
    row = db.execute(f"SELECT status FROM units WHERE {_UNIT_WHERE}", key).fetchone()
    if row is None:
        raise UnknownRecord(f"no {_name(key)}")
    return row[0]


def _check_live_attempt(db: Database, key: UnitKey, attempt: int, node: str,
                        status: str) -> tuple[str, bool] | None:
    """Check that `attempt` is live on `node`; returns the unit's status and whether
    other attempts of the unit are live (one query: this runs for every answer), or
    None for an attempt that the end of its run closed (see _close_attempts)."""
    row = db.execute(
        "SELECT u.status, a.node, a.status, (SELECT COUNT(*) FROM attempts o WHERE "
        "o.run_id = u.run_id AND o.round = u.round AND o.unit_id = u.unit_id AND "
        "o.status = 'in_progress' AND o.attempt != ?), (SELECT state FROM runs r WHERE "
        "r.id = u.run_id) FROM units u LEFT JOIN attempts a ON "
        "a.run_id = u.run_id AND a.round = u.round AND a.unit_id = u.unit_id AND "
        "a.attempt = ? WHERE u.run_id = ? AND u.round = ? AND u.unit_id = ?",
        (attempt, attempt, *key)).fetchone()
    if row is None:
        raise UnknownRecord(f"no {_name(key)}")
    current, owner, attempt_status, others, run_state = row
    if owner is None:
        raise UnknownRecord(f"{_name(key)}: no attempt {attempt}")
    if attempt_status != "in_progress" and run_state != "running" and owner == node:
        return None
    if attempt_status != "in_progress":
        raise IllegalTransition(f"{_name(key)}: attempt {attempt} cannot go from "
                                f"{attempt_status} to {status}; it already ended")
    if owner != node:
        raise ValueError(f"{_name(key)}: attempt {attempt} runs on {owner}, not {node}")
    return current, others > 0


def _after_attempt(key: UnitKey, current: str, outcome: str, others_live: bool) -> str:
    """The unit's status once one of its attempts ended with `outcome`."""
    if current in SETTLED:
        if outcome in LATE_ENDS:
            return current
        raise IllegalTransition(f"{_name(key)}: cannot go from {current} to {outcome}; "
                                "its result came after the unit settled")
    if outcome in ("completed", "discarded") or not others_live:
        return outcome
    return current


def _update_unit(db: Database, key: UnitKey, new: str, outcome: str, node: str,
                 reason: str | None, now: float) -> None:
    """The unit row after an attempt ended; while the unit stays in_progress it keeps
    the node of its newest attempt."""
    db.execute(f"UPDATE units SET status = ?, failures = failures + ?, node = COALESCE(?, node), "
               f"last_reason = COALESCE(?, last_reason), updated = ? WHERE {_UNIT_WHERE}",
               (new, 1 if outcome in COUNTED_FAILURES else 0,
                None if new == "in_progress" else node, reason, now, *key))


def _settle(db: Database, run_id: str, round_index: int | None, reason: str,
            now: float) -> int:
    """Cancel every unsettled unit of a run (or one round); live attempts stay open."""
    rows = db.execute("SELECT round, unit_id, status FROM units WHERE run_id = ? "
                      "AND (CAST(? AS INTEGER) IS NULL OR round = ?) AND status IN (?, ?, ?, ?)",
                      (run_id, round_index, round_index, *UNSETTLED)).fetchall()
    db.executemany(f"UPDATE units SET status = 'cancelled', last_reason = ?, updated = ? "
                   f"WHERE {_UNIT_WHERE}", [(reason, now, run_id, r, u) for r, u, _ in rows])
    db.executemany(_EVENT_INSERT, [(run_id, r, u, None, None, s, "cancelled", None, reason, now)
                                   for r, u, s in rows])
    return len(rows)


def _close_attempts(db: Database, run_id: str, reason: str, now: float) -> int:
    """Close every live attempt of a run as cancelled, its unit left as it is: once the
    run has ended (or its coordinator died) nobody waits for those answers, and an
    attempt left in_progress would look like work still out. Returns how many."""
    rows = db.execute("SELECT a.round, a.unit_id, a.attempt, a.node, u.status FROM attempts a "
                      "INDEXED BY attempts_by_status JOIN units u ON u.run_id = a.run_id AND "
                      "u.round = a.round AND u.unit_id = a.unit_id WHERE a.run_id = ? AND "
                      "a.status = 'in_progress'", (run_id,)).fetchall()
    db.executemany(f"UPDATE attempts SET status = 'cancelled', ended = ?, reason = ? "
                   f"WHERE {_UNIT_WHERE} AND attempt = ?",
                   [(now, reason, run_id, r, u, a) for r, u, a, _, _ in rows])
    db.executemany(_EVENT_INSERT, [(run_id, r, u, a, n, s, s, "cancelled", reason, now)
                                   for r, u, a, n, s in rows])
    return len(rows)


def _run_record(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(*row[:7], json.loads(row[7]), *row[8:])


def _unfinished(row: tuple[Any, ...], mine: list[tuple[str, float]],
                now: float) -> UnfinishedUnit:
    """`mine`: the unit's live attempts as (node, started), oldest attempt first."""
    round_index, unit_id, status, node, updated, attempts, failures, reason = row
    owner, since = mine[-1] if mine else (node, updated)
    return UnfinishedUnit(round=round_index, unit_id=unit_id, status=status, node=owner,
                          age_seconds=max(0.0, now - since), attempts=attempts,
                          live_attempts=len(mine), failures=failures, last_reason=reason)
