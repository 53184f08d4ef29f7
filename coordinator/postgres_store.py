"""The run store on PostgreSQL: `coordinator_node.py PORT POLICY --store postgresql://...`.

A peer of the SQLite store (coordinator/run_store.py): the same ledger
(coordinator/sql_ledger.py, with psycopg's placeholders), on a server that coordinators on
several machines share. This module owns what is PostgreSQL's: the pool of connections,
how a transaction begins (with the leader's fencing check), the driver's errors, and the
schema (coordinator/postgres_schema.py). What PostgreSQL keeps besides the ledger (run
files, kept results) is coordinator/postgres_keeping.py's; riding out the database's
outages and making the hot writes behind the run, coordinator/store_outage.py's.

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
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from thrift_trainer.coordinator.ledger_sql import POSTGRES
from thrift_trainer.coordinator.postgres_keeping import FILE_PART_BYTES, KeepsFilesAndResults
from thrift_trainer.coordinator.postgres_location import (  # noqa: F401 - is_postgres_url: for the cli
    is_postgres_url,
    parameters,
    redacted,
    without_passwords,
)
from thrift_trainer.coordinator.postgres_schema import SCHEMA_VERSION, check_schema
from thrift_trainer.coordinator.postgres_session import PostgresSession, connect_problem, first_line
from thrift_trainer.coordinator.sql_ledger import SqlLedger
from thrift_trainer.coordinator.store_outage import (
    OUTAGE_SECONDS,
    ConnectionLost,
    LeadershipLost,
    OutageRider,
)
from thrift_trainer.coordinator.store_records import RunStoreError, StoreUnavailable
from thrift_trainer.coordinator.write_behind import Call
from thrift_trainer.engine import runtime

__all__ = ["FILE_PART_BYTES", "OUTAGE_SECONDS", "SCHEMA_VERSION", "ConnectionLost",
           "LeadershipLost", "NotLeading", "PostgresRunStore", "is_postgres_url", "redacted"]

CONNECT_SECONDS = 10.0
RECONNECT_SECONDS = 2.0  # one try for a connection while the database is away
IDLE_IN_TRANSACTION_MS = 5000


def _commit_unknown(session: PostgresSession | None, exc: psycopg.Error) -> bool:
    """Whether a transaction whose connection broke may have committed: only if its COMMIT
    was sent. A server that ends a session (fast shutdown, pg_terminate_backend) answers
    57P01 only to a statement it did not complete: a COMMIT it completed is answered first,
    and one completed locally while waiting for a synchronous standby gets no message at
    all. So that answer means nothing was committed, and the transaction is made again."""
    if session is None or not session.committing:
        return False
    return not isinstance(exc, psycopg.errors.AdminShutdown)


class NotLeading(RunStoreError):
    """A write on a store whose coordinator does not lead (a standby): it only reads."""


class PostgresRunStore(KeepsFilesAndResults, SqlLedger):
    """The run store in a PostgreSQL database; see the module docstring."""

    _q = POSTGRES
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
        self.epoch: int | None = None  # the leader's fencing epoch; None: no writes checked
        self.writes_need_epoch = False  # a coordinator's store: writes only while leading
        self._session: PostgresSession | None = None
        # what the server calls this process's sessions: a new leader ends an expired
        # leader's sessions by it (coordinator/leadership.py)
        self.application_name = (f"trainer {socket.gethostname()[:32]} pid {os.getpid()} "
                                 f"{runtime.token_hex(3)}")
        problem = connect_problem(url, connect_seconds)  # one try says why, at once
        if problem is not None:
            raise RunStoreError(f"cannot connect to the run store {self.path}: {problem}")
        self._pool = _pool(url, self.application_name, self.path, connect_seconds)
        self._start(clock)
        self._rider = OutageRider(self, outage_seconds, defer_writes,
                                  self._in_one_transaction, self._keep_later)
        self._start_keeping()

    @property
    def unreachable_since(self) -> float | None:  # type: ignore[override]
        return self._rider.unreachable_since

    # ----------------------------------------------------- outages, write-behind
    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._rider.call(method, *args, **kwargs)

    def _before_read(self) -> None:
        self._rider.before_read()

    @contextmanager
    def batch(self) -> Iterator[None]:
        with self._rider.batch(), self._tx():
            yield

    def _in_one_transaction(self, calls: list[Call]) -> None:
        """Deferred calls in one transaction, their statements pipelined; a failing call
        fails the whole batch (no savepoints), which the rider then makes call by call."""
        with self._lock:
            self._savepoints = False
            try:
                with self._tx() as db, db.connection.pipeline():
                    for method, args, kwargs in calls:
                        method(self, *args, **kwargs)
            finally:
                self._savepoints = True

    # -------------------------------------------------------------- plumbing
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
            text = f"run store {self.path}: {without_passwords(first_line(exc), self.url)}"
            if session is None or session.lost:
                raise ConnectionLost(text, commit_unknown=_commit_unknown(session, exc)) from exc
            raise StoreUnavailable(text) from exc

    def _begin(self, db: PostgresSession, write: bool) -> None:
        db.execute("BEGIN" if write else "BEGIN READ ONLY")
        if write:
            self._check_epoch(db)

    def _check_schema(self) -> None:
        with self._tx() as db:
            check_schema(db, self.path)

    # -------------------------------------------------------------- fencing
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
        self._rider.write_afresh()

    # ------------------------------------------------------------- its life
    def abandon(self) -> None:
        self._rider.writes.close(flush=False)
        self._results.close(flush=False)
        db, self._db = self._db, None
        if db is not None:
            self._pool.close(timeout=0)

    def close(self) -> None:
        if hasattr(self, "_results"):  # absent when the schema check failed (in _start)
            self._rider.writes.close(flush=self._db is not None)
            self._results.close(flush=False)  # the run is over: nobody takes them up
        with self._lock:
            if self._db is not None:
                self._db = None
                if self._session is not None:
                    self._pool.putconn(self._session.connection)
                    self._session = None
                self._pool.close()

    @contextmanager
    def connection(self, wait_seconds: float | None = None) -> Iterator[psycopg.Connection]:
        """A connection of the pool apart from the ledger's (the lease keeper's), waited
        for at most ``wait_seconds`` (None: CONNECT_SECONDS)."""
        timeout = CONNECT_SECONDS if wait_seconds is None else wait_seconds
        with self._pool.connection(timeout=timeout) as connection:
            yield connection


def _pool(url: str, application_name: str, path: str, connect_seconds: float) -> ConnectionPool:
    """The store's pool, open. reconnect_timeout: the pool's own tries back off
    exponentially (a minute apart after a long outage), so each gives up within seconds
    and the next getconn starts a fresh one; check: a connection the outage broke is
    replaced, never handed out."""
    pool = ConnectionPool(
        url, min_size=1, max_size=4, open=False, name="run-store",
        reconnect_timeout=RECONNECT_SECONDS, check=ConnectionPool.check_connection,
        kwargs={"autocommit": True, "application_name": application_name,
                "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"})
    try:
        pool.open(wait=True, timeout=connect_seconds)
    except PoolTimeout:
        pool.close()
        raise RunStoreError(f"cannot connect to the run store {path}: timed out "
                            f"after {connect_seconds:g} s") from None
    return pool
