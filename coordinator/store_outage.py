"""A database server's store riding out outages, with its hot writes made behind the run.

OutageRider wraps every call the engine makes of the PostgreSQL store (the methods marked
`rides_out_outages` in coordinator/sql_ledger.py): a call whose answer the engine does not
use is queued (coordinator/write_behind.py) and returns at once; any other is made after
every queued one, and made again, whole, every RETRY_SECONDS while the database is away,
so training pauses and then carries on, losing nothing; `unreachable_since` says since
when, for `status`. A transaction that failed before its COMMIT was sent did nothing and
is safe to make again; one cut off during its COMMIT may or may not have committed, so it
is not retried: the run fails, as it does when the database stays away past
`outage_seconds` (--store-outage), and is carried on (resumed) once the database is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from thrift_trainer.coordinator.store_records import RunStoreError, StoreUnavailable
from thrift_trainer.coordinator.write_behind import (
    DEFERRED,
    NEW_LIFE,
    BatchDepth,
    Call,
    WriteBehind,
    run_of,
)
from thrift_trainer.engine import runtime

log = logging.getLogger("coordinator.store")
RETRY_SECONDS = 0.5
OUTAGE_SECONDS = 60.0


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



class OutageRider:
    """The calls of ``store`` made later or again; see the module docstring.
    ``in_one_transaction(calls)``: the store makes queued calls in one transaction;
    ``keep_later(call)``: the store queues a kept result for a writer of its own."""

    def __init__(self, store: Any, outage_seconds: float, defer_writes: bool,
                 in_one_transaction: Callable[[list[Call]], None],
                 keep_later: Callable[[Call], None]) -> None:
        self._store = store
        self.outage_seconds = outage_seconds
        self.defer_writes = defer_writes
        self._in_one_transaction = in_one_transaction
        self._keep_later = keep_later
        self.unreachable_since: float | None = None  # runtime.monotonic() of the outage
        self._batches = BatchDepth()
        self._lock = threading.Lock()
        self.writes = WriteBehind(self._apply)

    def batch(self) -> AbstractContextManager[None]:
        """Inside a batch, calls are made at once, as part of it (only the batch's caller
        can make it again)."""
        return self._batches.inside()

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call the engine makes: deferred, or made after every deferred one, again
        while the database is away."""
        store = self._store
        if self._batches.depth:
            return method(store, *args, **kwargs)
        if self.defer_writes and method.__name__ == "keep_result":
            self._keep_later((method, args, kwargs))
            return None
        if self.defer_writes and method.__name__ in DEFERRED:
            self.writes.put((method, args, kwargs))
            return None
        run_id = run_of((method, args, kwargs))
        if run_id is not None and method.__name__ in NEW_LIFE:
            self.writes.forget(run_id)
        self.writes.flush(run_id=run_id)
        return self.ride_out(lambda: method(store, *args, **kwargs))

    def before_read(self) -> None:
        if self.unreachable_since is None:  # while the database is away, status must answer
            self.writes.flush(quiet=True)

    def write_afresh(self) -> None:
        """Drop the failures the refused writes left and the calls still queued."""
        stale, self.writes = self.writes, WriteBehind(self._apply)
        stale.close(flush=False)

    def ride_out(self, make: Callable[[], Any]) -> Any:
        """``make()``, made again while the database is away (see the module docstring)."""
        started = None
        while True:
            try:
                result = make()
            except ConnectionLost as exc:
                if exc.commit_unknown:
                    raise
                now = runtime.monotonic()
                if started is None and self.unreachable_since is None:
                    started = now  # a connection that broke: a new one may work at once
                    continue
                # the outage counts from its start, whichever call met it first
                away = self._away(now if started is None else started)
                if now - away >= self.outage_seconds:
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
            self.ride_out(lambda: self._in_one_transaction(calls))
            return
        except (LeadershipLost, ConnectionLost):
            raise
        except (RunStoreError, ValueError):
            pass  # a refusal somewhere in the batch: find it
        for call in calls:
            method, args, kwargs = call
            try:
                self.ride_out(lambda: method(self._store, *args, **kwargs))  # noqa: B023 - at once
            except (LeadershipLost, ConnectionLost):
                raise
            except (RunStoreError, ValueError) as exc:
                self.writes.refused(call, exc)

    def _away(self, since: float) -> float:
        """Since when the database is away: ``since``, unless another call knew earlier."""
        with self._lock:
            if self.unreachable_since is None:
                self.unreachable_since = since
                log.warning("the run store %s cannot be reached: training pauses until it "
                            "is back (at most %g s)", self._store.path, self.outage_seconds)
            return self.unreachable_since

    def _back(self) -> None:
        with self._lock:
            if self.unreachable_since is not None:
                log.warning("the run store %s is back after %.1f s: training goes on",
                            self._store.path, runtime.monotonic() - self.unreachable_since)
                self.unreachable_since = None
