"""The run store on PostgreSQL: `coordinator_node.py PORT POLICY --store postgresql://...`.

The ledger is coordinator/run_store.py's, statement for statement: PostgresSession runs
them on a psycopg 3 connection (`?` becomes `%s`; SQLite's INDEXED BY hints are dropped),
with server-side parameters, so the statements a run repeats are prepared once per
connection. What PostgreSQL adds is what lets
a coordinator on another machine carry on without the first one's disk:

- run_files: each run's request.json, metrics.jsonl and checkpoint.npz (weights, optimizer
  and policy state), in bytea parts of FILE_PART_BYTES, so a model of any size fits;
- leader and lease: the coordinator that leads, its fencing epoch and when its lease
  expires (coordinator/leadership.py takes and renews it).

Fencing. A store told its epoch (`fence(epoch)`) begins every write transaction with a
share lock on the leader row and a check of the epoch there: a takeover's UPDATE of that
row waits for the write in progress to commit, and every write after it finds the newer
epoch and raises LeadershipLost, so a leader that was paused (SIGSTOP, a long GC, a cut
network) never writes after losing the lease. A store with no epoch (a standby, a
read-only command) refuses every write with NotLeading. A session left idle inside a
transaction for IDLE_IN_TRANSACTION_MS (a process stopped mid-transaction) is ended by the
server, and a new leader ends the expired leader's sessions before it takes the epoch
(one stopped in the middle of a pipeline is not idle to the server), so no lock of theirs
can hold a takeover up.

Connections come from a psycopg_pool pool (the ledger's, the lease keeper's): one that
broke (the server restarted) is replaced on the next transaction.

The database away (restarted, down, cut off): a call the engine makes while it trains is
made again, whole, every RETRY_SECONDS until the database answers, so training pauses and
then carries on, losing nothing; `unreachable_since` says since when, for `status`. A
transaction that failed before its COMMIT was sent did nothing and is safe to make again;
one cut off during its COMMIT may or may not have committed, so it is not retried: the run
fails, as it does when the database stays away past `outage_seconds` (--store-outage), and
is carried on (resumed) once the database is back.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from coordinator import drills
from coordinator.kept_results import StoredResult
from coordinator.postgres_location import (  # noqa: F401 - is_postgres_url: for the cli
    is_postgres_url,
    parameters,
    redacted,
    without_passwords,
)
from coordinator.run_store import (
    RunStore,
    SchemaError,
    null_if_nan,
    reads_what_was_written,
    rides_out_outages,
)
from coordinator.write_behind import DEFERRED, Call, WriteBehind, run_of
from engine import runtime
from engine.ledger import RunStoreError, StoreUnavailable

log = logging.getLogger("coordinator.store")
SCHEMA_VERSION = 2  # 2: kept_results
FILE_PART_BYTES = 16 * 2**20
CONNECT_SECONDS = 10.0
RECONNECT_SECONDS = 2.0  # one try for a connection while the database is away
RETRY_SECONDS = 0.5
OUTAGE_SECONDS = 60.0
IDLE_IN_TRANSACTION_MS = 5000
RESULTS_QUEUE_BYTES = 256 * 2**20  # kept results waiting for their writer; past it: dropped
SCHEMA_LOCK = 0x7472_6169  # advisory lock id: two coordinators creating the schema at once
# calls that start a run afresh: the writes its earlier life could not make are behind it
_NEW_LIFE = frozenset({"create_run", "resume_run"})

# The SQLite store's tables in PostgreSQL's types, written out rather than derived from
# coordinator/run_store.py's: each database's schema has its own version and migrations,
# and a change to one must not silently change the other's.
_SCHEMA = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    # rowid: the order of insertion, as SQLite's rowid (runs created in the same second)
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        rowid BIGINT GENERATED ALWAYS AS IDENTITY,
        created DOUBLE PRECISION NOT NULL,
        state TEXT NOT NULL
            CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
        algorithm TEXT NOT NULL,
        model TEXT NOT NULL,
        dataset TEXT NOT NULL,
        rounds INTEGER NOT NULL,
        config TEXT NOT NULL,
        policy INTEGER,
        message TEXT,
        ended DOUBLE PRECISION)""",
    "CREATE INDEX runs_by_created ON runs (created)",
    """CREATE TABLE rounds (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        round INTEGER NOT NULL,
        validation_error DOUBLE PRECISION,
        validation_loss DOUBLE PRECISION,
        train_loss DOUBLE PRECISION,
        seconds DOUBLE PRECISION,
        completed_units INTEGER NOT NULL,
        discarded_units INTEGER NOT NULL,
        ended DOUBLE PRECISION NOT NULL,
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
        created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        pass INTEGER,
        PRIMARY KEY (run_id, round, unit_id))""",
    "CREATE INDEX units_by_status ON units (run_id, status)",
    """CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        node TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed',
            'stale', 'pending', 'discarded', 'cancelled')),
        started DOUBLE PRECISION NOT NULL,
        ended DOUBLE PRECISION,
        reason TEXT,
        PRIMARY KEY (run_id, round, unit_id, attempt),
        FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
    "CREATE INDEX attempts_by_status ON attempts (run_id, status)",
    """CREATE TABLE unit_events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER,
        node TEXT,
        from_status TEXT,
        to_status TEXT NOT NULL,
        attempt_status TEXT,
        reason TEXT,
        time DOUBLE PRECISION NOT NULL,
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
        samples BIGINT NOT NULL DEFAULT 0,
        last_answer DOUBLE PRECISION,
        last_failure DOUBLE PRECISION,
        last_reason TEXT,
        last_heartbeat DOUBLE PRECISION,
        PRIMARY KEY (run_id, node))""",
    """CREATE TABLE run_files (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        part INTEGER NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (run_id, name, part))""",
    # The leader and its fencing epoch; the lease's expiry in a row of its own, so that
    # renewing it never waits for the leader's writes, which share-lock the leader row.
    """CREATE TABLE leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch BIGINT NOT NULL,
        holder TEXT,
        address TEXT)""",
    "INSERT INTO leader (id, epoch) VALUES (1, 0)",
    """CREATE TABLE lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        expires TIMESTAMPTZ)""",
    "INSERT INTO lease (id) VALUES (1)",
)
# What each version adds to the one before; a database of an older version is brought
# up to date under the schema lock, a fresh one gets _SCHEMA and then every step.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: units' results, kept until a checkpoint covers them (coordinator/kept_results.py)
    2: ("""CREATE TABLE kept_results (
            run_id TEXT NOT NULL,
            round INTEGER NOT NULL,
            unit_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            epoch BIGINT,
            node TEXT NOT NULL,
            num_samples BIGINT NOT NULL,
            loss DOUBLE PRECISION,
            names TEXT NOT NULL,
            sequence INTEGER,
            staleness INTEGER,
            PRIMARY KEY (run_id, round, unit_id),
            FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
        """CREATE TABLE kept_result_parts (
            run_id TEXT NOT NULL,
            round INTEGER NOT NULL,
            unit_id TEXT NOT NULL,
            part INTEGER NOT NULL,
            data BYTEA NOT NULL,
            PRIMARY KEY (run_id, round, unit_id, part),
            FOREIGN KEY (run_id, round, unit_id) REFERENCES kept_results ON DELETE CASCADE)""",
        # tensors hardly compress: not trying saves the server the time
        "ALTER TABLE kept_result_parts ALTER COLUMN data SET STORAGE EXTERNAL"),
}


class NotLeading(RunStoreError):
    """A write on a store whose coordinator does not lead (a standby): it only reads."""


class ConnectionLost(StoreUnavailable):
    """The database could not be reached; ``commit_unknown``: the connection broke while
    a COMMIT was on its way, so whether the transaction took effect is unknown."""

    def __init__(self, message: str, commit_unknown: bool = False) -> None:
        super().__init__(message)
        self.commit_unknown = commit_unknown


class LeadershipLost(StoreUnavailable):
    """A newer leader holds the store: this coordinator's writes are refused from now on.
    A StoreUnavailable, so a run stops at its next write as it does on a full disk, and
    writes nothing more."""


@functools.lru_cache(maxsize=512)
def _postgres_sql(statement: str) -> str:
    """A statement of the SQLite store as psycopg takes it."""
    statement = re.sub(r"\s+INDEXED BY \w+", "", statement)
    return statement.replace("%", "%%").replace("?", "%s")


class PostgresSession:
    """A psycopg connection that takes the SQLite store's statements (the Database
    protocol of coordinator/run_store.py)."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection
        self.committing = False  # the last statement sent was a COMMIT

    @property
    def in_transaction(self) -> bool:
        status = self.connection.info.transaction_status
        return status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)

    def execute(self, sql: str, parameters: Any = None) -> psycopg.Cursor:
        self.committing = sql == "COMMIT"
        return self.connection.execute(_postgres_sql(sql), parameters)

    def close(self) -> None:
        self.connection.close()

    @property
    def lost(self) -> bool:
        return self.connection.closed or self.connection.broken

    def executemany(self, sql: str, parameters: Iterable[Any]) -> None:
        rows = list(parameters)
        if rows:
            with self.connection.cursor() as cursor:
                cursor.executemany(_postgres_sql(sql), rows)


class PostgresRunStore(RunStore):
    """The run store in a PostgreSQL database; see the module docstring."""

    _DriverError = psycopg.Error
    _IntegrityError = psycopg.IntegrityError

    def __init__(self, url: str, *, clock: Callable[[], float] = runtime.wall,
                 connect_seconds: float = CONNECT_SECONDS,
                 outage_seconds: float = OUTAGE_SECONDS, defer_writes: bool = True) -> None:
        """``defer_writes``: the engine's hot writes are made later, in batches
        (coordinator/write_behind.py); without, every call is made when called, as in the
        SQLite store (tests of the ledger's semantics)."""
        parameters(url)  # a location libpq refuses: one line, before anything is shown
        self.url = url
        self.path = redacted(url)
        self.outage_seconds = outage_seconds
        self.defer_writes = defer_writes
        self.unreachable_since: float | None = None  # runtime.monotonic() of the outage
        self._batches = threading.local()  # this thread's depth of batch() blocks
        self._lock_for_outage = threading.Lock()
        self.epoch: int | None = None  # the leader's fencing epoch; None: no writes checked
        self.writes_need_epoch = False  # a coordinator's store: writes only while leading
        self._session: PostgresSession | None = None
        # what the server calls this process's sessions: a new leader ends an expired
        # leader's sessions by it (coordinator/leadership.py)
        self.application_name = (f"trainer {socket.gethostname()[:32]} pid {os.getpid()} "
                                 f"{runtime.token_hex(3)}")
        problem = _connect_problem(url, connect_seconds)  # one try says why, at once
        if problem is not None:
            raise RunStoreError(f"cannot connect to the run store {self.path}: {problem}")
        # reconnect_timeout: the pool's own tries back off exponentially (a minute apart
        # after a long outage), so each gives up within seconds and the next getconn starts
        # a fresh one; check: a connection the outage broke is replaced, never handed out
        self._pool = ConnectionPool(
            url, min_size=1, max_size=4, open=False, name="run-store",
            reconnect_timeout=RECONNECT_SECONDS, check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "application_name": self.application_name,
                    "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"})
        try:
            self._pool.open(wait=True, timeout=connect_seconds)
        except PoolTimeout:
            self._pool.close()
            raise RunStoreError(f"cannot connect to the run store {self.path}: timed out "
                                f"after {connect_seconds:g} s") from None
        self._start(clock)
        self._writes = WriteBehind(self._apply)
        self._results = WriteBehind(self._write_results, "result-writer", _result_bytes,
                                    RESULTS_QUEUE_BYTES)
        self._dropped_results = False  # said once

    # --------------------------------------------------------------- plumbing
    def _open(self) -> PostgresSession:
        self._session = PostgresSession(self._pool.getconn(timeout=CONNECT_SECONDS))
        return self._session

    def _connection(self) -> PostgresSession:
        if self._db is None:
            raise RunStoreError(f"the run store {self.path} is closed")
        session = self._session
        if session is None or session.lost:
            if session is not None:  # the pool drops a broken connection
                self._pool.putconn(session.connection)
                self._session = None
            try:
                self._db = PostgresSession(self._pool.getconn(timeout=RECONNECT_SECONDS))
            except PoolTimeout:
                raise ConnectionLost(f"run store {self.path}: the database cannot be "
                                     "reached") from None
            self._session = self._db
        return self._db

    @contextmanager
    def _unavailable_on_error(self) -> Iterator[None]:
        """psycopg's errors as StoreUnavailable; a lost connection as ConnectionLost."""
        try:
            yield
        except psycopg.Error as exc:
            session = self._session
            text = f"run store {self.path}: {without_passwords(_first_line(exc), self.url)}"
            if session is None or session.lost:
                raise ConnectionLost(text, commit_unknown=session is not None and
                                     session.committing) from exc
            raise StoreUnavailable(text) from exc

    @contextmanager
    def batch(self) -> Iterator[None]:
        self._batches.depth = getattr(self._batches, "depth", 0) + 1
        try:
            with super().batch():
                yield
        finally:
            self._batches.depth -= 1

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call the engine makes: deferred (coordinator/write_behind.py), or made after
        every deferred one, again while the database is away; inside a batch, made at
        once as part of it (only the batch's caller can make it again)."""
        if getattr(self._batches, "depth", 0):
            return method(self, *args, **kwargs)
        if self.defer_writes and method.__name__ == "keep_result":
            self._keep_later((method, args, kwargs))
            return None
        if self.defer_writes and method.__name__ in DEFERRED:
            self._writes.put((method, args, kwargs))
            return None
        run_id = run_of((method, args, kwargs))
        if run_id is not None and method.__name__ in _NEW_LIFE:
            self._writes.forget(run_id)
        self._writes.flush(run_id=run_id)
        return self._ride_out(lambda: method(self, *args, **kwargs))

    def _before_read(self) -> None:
        if self.unreachable_since is None:  # while the database is away, status must answer
            self._writes.flush(quiet=True)

    def _ride_out(self, make: Callable[[], Any]) -> Any:
        """``make()``, made again while the database is away (see the module docstring)."""
        started = None
        while True:
            try:
                result = make()
            except ConnectionLost as exc:
                if exc.commit_unknown:
                    raise
                now = runtime.monotonic()
                if started is None:  # a connection that broke: a new one may work at once
                    started = now
                    continue
                self._away(now)
                if now - started >= self.outage_seconds:
                    raise ConnectionLost(f"{exc} for {self.outage_seconds:g} s (--store-"
                                         "outage): the run can be resumed once it is back"
                                         ) from exc
                runtime.sleep(RETRY_SECONDS)
                continue
            if self.unreachable_since is not None:
                self._back()
            return result

    def _apply(self, calls: list[Call]) -> None:
        """Make deferred calls in one transaction; when one of them fails, one by one."""
        try:
            self._ride_out(lambda: self._in_one_transaction(calls))
            return
        except (LeadershipLost, ConnectionLost):
            raise
        except (RunStoreError, ValueError):
            pass  # a refusal somewhere in the batch: find it
        for call in calls:
            method, args, kwargs = call
            try:
                self._ride_out(lambda: method(self, *args, **kwargs))  # noqa: B023 - at once
            except (LeadershipLost, ConnectionLost):
                raise
            except (RunStoreError, ValueError) as exc:
                self._writes.refused(call, exc)

    def _in_one_transaction(self, calls: list[Call]) -> None:
        with self._lock:
            self._savepoints = False  # a failing call fails the batch: see _apply
            try:
                with self._tx() as db, db.connection.pipeline():
                    for method, args, kwargs in calls:
                        method(self, *args, **kwargs)
            finally:
                self._savepoints = True

    def _away(self, now: float) -> None:
        with self._lock_for_outage:
            if self.unreachable_since is None:
                self.unreachable_since = now
                log.warning("the run store %s cannot be reached: training pauses until it "
                            "is back (at most %g s)", self.path, self.outage_seconds)

    def _back(self) -> None:
        with self._lock_for_outage:
            if self.unreachable_since is not None:
                log.warning("the run store %s is back after %.1f s: training goes on",
                            self.path, runtime.monotonic() - self.unreachable_since)
                self.unreachable_since = None

    def _begin(self, db: PostgresSession, write: bool) -> None:  # type: ignore[override]
        db.execute("BEGIN" if write else "BEGIN READ ONLY")
        if write:
            self._check_epoch(db)

    def _check_epoch(self, db: PostgresSession) -> None:
        if self.epoch is None:
            if self.writes_need_epoch:
                raise NotLeading(f"run store {self.path}: this coordinator stands by; "
                                 "only the leader writes")
            return
        (current,) = db.execute("SELECT epoch FROM leader WHERE id = 1 FOR SHARE").fetchone()
        if current != self.epoch:
            raise LeadershipLost(f"run store {self.path}: a newer leader holds it (epoch "
                                 f"{current}, this coordinator's {self.epoch})")

    def fence(self, epoch: int | None) -> None:
        """Write as the leader of ``epoch`` (None: write nothing, as a standby)."""
        with self._lock:
            self.epoch = epoch
            self.writes_need_epoch = True

    def write_afresh(self) -> None:
        """Write as a coordinator that never led: a leader fenced once that leads again
        drops the failures its refused writes left (raised by every later call) and the
        calls still queued then. Called once no run of its earlier lead writes any more."""
        stale, self._writes = self._writes, WriteBehind(self._apply)
        stale.close(flush=False)

    def abandon(self) -> None:
        self._writes.close(flush=False)
        self._results.close(flush=False)
        db, self._db = self._db, None
        if db is not None:
            self._pool.close(timeout=0)

    def close(self) -> None:
        if hasattr(self, "_writes"):  # absent when the schema check failed
            self._writes.close(flush=self._db is not None)
            self._results.close(flush=False)  # the run is over: nobody takes them up
        with self._lock:
            if self._db is not None:
                self._db = None
                if self._session is not None:
                    self._pool.putconn(self._session.connection)
                    self._session = None
                self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A connection of the pool apart from the ledger's (the lease keeper's)."""
        with self._pool.connection(timeout=CONNECT_SECONDS) as connection:
            yield connection

    def _check_schema(self) -> None:
        with self._tx() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
            if db.execute("SELECT to_regclass('schema_version')").fetchone()[0] is not None:
                self._check_version(db)
                return
            tables = db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = "
                                "current_schema()").fetchone()[0]
            if tables:
                raise SchemaError(f"{self.path} holds {tables} tables but no run store (no "
                                  "schema_version table): use another database")
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("INSERT INTO schema_version (version) VALUES (1)")
            _migrate(db, 1)

    def _check_version(self, db: PostgresSession) -> None:
        rows = db.execute("SELECT version FROM schema_version LIMIT 2").fetchall()
        version = rows[0][0] if len(rows) == 1 else None
        if version == SCHEMA_VERSION:
            return
        if isinstance(version, int) and 1 <= version < SCHEMA_VERSION:
            log.info("run store %s: schema version %d brought up to %d", self.path, version,
                     SCHEMA_VERSION)
            _migrate(db, version)
            return
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise SchemaError(f"{self.path} has run store schema version {version}, newer "
                              f"than this coordinator understands ({SCHEMA_VERSION}): use a "
                              "newer coordinator or another database")
        raise SchemaError(f"{self.path} has an unknown run store schema version "
                          f"{[r[0] for r in rows]!r} (expected {SCHEMA_VERSION})")

    # ------------------------------------------------------------- run files
    keeps_files = True  # a run's files live here too, for a coordinator on another machine

    @rides_out_outages
    def store_file(self, run_id: str, name: str, path: Path,
                   round_index: int | None = None) -> None:
        """Keep the file at ``path`` as the run's ``name``, replacing what was there, in one
        transaction read part by part (a checkpoint never shows half old, half new).
        ``round_index``: a checkpoint's round: the results kept for the rounds it covers
        go in the same transaction (and drills may die there: coordinator/drills.py)."""
        with self._tx() as db, open(path, "rb") as f:
            db.execute("DELETE FROM run_files WHERE run_id = ? AND name = ?", (run_id, name))
            if round_index is not None:
                db.execute("DELETE FROM kept_results WHERE run_id = ? AND round <= ?",
                           (run_id, round_index))
            part = 0
            while chunk := f.read(FILE_PART_BYTES):
                db.execute("INSERT INTO run_files (run_id, name, part, data) VALUES "
                           "(?, ?, ?, ?)", (run_id, name, part, chunk))
                part += 1
                if round_index is not None:  # (the kept results written first)
                    drills.point("checkpoint", round_index,
                                 ready=lambda: self._results.flush(quiet=True))
            if part == 0:
                db.execute("INSERT INTO run_files (run_id, name, part, data) VALUES "
                           "(?, ?, 0, ?)", (run_id, name, b""))

    @reads_what_was_written
    def restore_files(self, run_id: str, folder: Path) -> list[str]:
        """Write the run's kept files into ``folder`` (created if needed), each atomically;
        returns their names."""
        with self._tx(write=False) as db:
            names = [n for (n,) in db.execute("SELECT DISTINCT name FROM run_files WHERE "
                                              "run_id = ? ORDER BY name", (run_id,))]
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            partial = folder / f".{name}.restoring"
            with self._tx(write=False) as db, open(partial, "wb") as f:
                for (data,) in db.execute("SELECT data FROM run_files WHERE run_id = ? AND "
                                          "name = ? ORDER BY part", (run_id, name)):
                    f.write(data)
            partial.replace(folder / name)
        return names

    # ---------------------------------------------------------- kept results
    keeps_results = True  # units' results, until a checkpoint covers them

    @rides_out_outages
    def keep_result(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                    node: str, num_samples: int, loss: float, names: str, data: bytes,
                    sequence: int | None = None, staleness: int | None = None) -> None:
        """Keep the result attempt ``attempt`` brought to a unit (``names``: its tensors'
        names as JSON, ``data`` their arrays; a stream's ``sequence`` among its round's
        results and ``staleness``: coordinator/kept_results.py), under this leader's
        epoch. A unit's result is kept once: a second is refused (ValueError)."""
        with self._tx() as db:
            _insert_result(db, self.epoch, run_id, round_index, unit_id, attempt, node,
                           num_samples, loss, names, data, sequence, staleness)

    def _keep_later(self, call: Call) -> None:
        """Queue a kept result for the result writer; dropped (said once) when results
        wait for more than RESULTS_QUEUE_BYTES: the database is slower than the run."""
        if not self._results.put(call) and not self._dropped_results:
            self._dropped_results = True
            log.warning("run store %s: results come faster than it writes them: some are not "
                        "kept (a takeover computes those again)", self.path)

    def _write_results(self, calls: list[Call]) -> None:
        """Write kept results in one transaction on a connection of their own, so that the
        ledger's writes (a round's end among them) never wait for them. A batch that fails
        is dropped with a warning: a result not kept is computed again after a takeover,
        nothing worse; a leader that lost the lead writes none (its epoch is checked)."""
        try:
            with self.connection() as connection:
                db = PostgresSession(connection)
                db.execute("BEGIN")
                try:
                    self._check_epoch(db)
                    with connection.pipeline():
                        for _, args, kwargs in calls:
                            _insert_result(db, self.epoch, *args, **kwargs)
                    db.execute("COMMIT")
                except BaseException:
                    connection.rollback()
                    raise
        except (psycopg.Error, RunStoreError, ValueError) as exc:
            log.warning("run store %s: %d kept results not written: %s", self.path,
                        len(calls), without_passwords(_first_line(exc), self.url))

    @reads_what_was_written
    def kept_results(self, run_id: str, round_index: int) -> list[StoredResult]:
        """The results kept for a round's completed units: a stream's in the order they
        were kept, a round's by unit id."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT k.unit_id, k.attempt, k.node, k.num_samples, k.loss, "
                              f"k.names, k.sequence, k.staleness, u.pass {_KEPT_FROM} "
                              "ORDER BY k.sequence, k.unit_id", (run_id, round_index)).fetchall()
            return [StoredResult(unit_id, attempt, node, samples,
                                 math.nan if loss is None else loss, names,
                                 self._result_data(db, run_id, round_index, unit_id), *order)
                    for unit_id, attempt, node, samples, loss, names, *order in rows]

    def _result_data(self, db: PostgresSession, run_id: str, round_index: int,
                     unit_id: str) -> bytes:
        return b"".join(bytes(data) for (data,) in db.execute(
            "SELECT data FROM kept_result_parts WHERE run_id = ? AND round = ? AND "
            "unit_id = ? ORDER BY part", (run_id, round_index, unit_id)))

    def _results_kept(self, db: PostgresSession,  # type: ignore[override]
                      run_id: str, round_index: int) -> set[tuple[int, str]]:
        """A round's units with a kept result; a stream's, those of its results kept
        without a gap from the round's first (the versions they made are made again only
        in their order)."""
        rows = db.execute(f"SELECT k.unit_id, k.sequence {_KEPT_FROM} ORDER BY k.sequence",
                          (run_id, round_index)).fetchall()
        if any(sequence is not None for _, sequence in rows):
            rows = _up_to_the_first_gap(rows)
        kept = {(round_index, unit_id) for unit_id, _ in rows}
        db.execute("DELETE FROM kept_results WHERE run_id = ? AND NOT (round = ? AND "
                   "unit_id = ANY(?))", (run_id, round_index, [u for _, u in kept]))
        return kept

    def _end_run(self, db: PostgresSession,  # type: ignore[override]
                 run_id: str, state: str, message: str | None, now: float) -> int:
        withdrawn = super()._end_run(db, run_id, state, message, now)
        if state == "completed":  # a failed or cancelled run may be resumed: they wait
            db.execute("DELETE FROM kept_results WHERE run_id = ?", (run_id,))
        return withdrawn


# The kept results of a run's round (parameters: run, round) whose unit is completed by
# the very attempt that brought them: the ledger and the result agree.
_KEPT_FROM = ("FROM kept_results k JOIN units u ON u.run_id = k.run_id AND u.round = k.round "
              "AND u.unit_id = k.unit_id JOIN attempts a ON a.run_id = k.run_id AND "
              "a.round = k.round AND a.unit_id = k.unit_id AND a.attempt = k.attempt "
              "WHERE k.run_id = ? AND k.round = ? AND u.status = 'completed' AND "
              "a.status = 'completed'")


def _insert_result(db: PostgresSession, epoch: int | None, run_id: str, round_index: int,
                   unit_id: str, attempt: int, node: str, num_samples: int, loss: float,
                   names: str, data: bytes, sequence: int | None = None,
                   staleness: int | None = None) -> None:
    """The rows of one kept result (see keep_result), while its run is running: a result
    whose write comes after its run ended is not kept."""
    try:
        db.execute("INSERT INTO kept_results (run_id, round, unit_id, attempt, epoch, node, "
                   "num_samples, loss, names, sequence, staleness) SELECT ?, ?, ?, ?, ?, ?, ?, "
                   "?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM runs WHERE id = ? AND state = "
                   "'running')", (run_id, round_index, unit_id, attempt, epoch, node,
                                  num_samples, null_if_nan(loss), names, sequence, staleness,
                                  run_id))
        view = memoryview(data)
        for part, start in enumerate(range(0, max(len(view), 1), FILE_PART_BYTES)):
            db.execute("INSERT INTO kept_result_parts (run_id, round, unit_id, part, data) "
                       "SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM kept_results WHERE "
                       "run_id = ? AND round = ? AND unit_id = ?)",
                       (run_id, round_index, unit_id, part, view[start:start + FILE_PART_BYTES],
                        run_id, round_index, unit_id))
    except psycopg.IntegrityError as exc:
        raise ValueError(f"unit {unit_id} (run {run_id}, round {round_index}): its result "
                         f"cannot be kept: {_first_line(exc)}") from None


def _result_bytes(call: Call) -> int:
    """The bytes a queued keep_result holds: its tensors'."""
    _, args, _ = call
    return len(args[8])


def _up_to_the_first_gap(rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (unit, sequence) rows, by sequence, whose sequences run 0, 1, 2, ... unbroken."""
    unbroken = []
    for place, row in enumerate(rows):
        if row[1] != place:
            break
        unbroken.append(row)
    return unbroken


def _migrate(db: PostgresSession, version: int) -> None:
    """Bring a schema of ``version`` up to SCHEMA_VERSION, in the caller's transaction."""
    for step in range(version + 1, SCHEMA_VERSION + 1):
        for statement in _MIGRATIONS[step]:
            db.execute(statement)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _connect_problem(url: str, seconds: float) -> str | None:
    """Why no connection can be made, in the server's words; None when one can."""
    try:
        psycopg.connect(url, connect_timeout=max(1, round(seconds))).close()
    except psycopg.Error as exc:
        return without_passwords(_first_line(exc), url)
    return None
