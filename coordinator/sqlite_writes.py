"""The SQLite store's hot writes, made behind the run (a coordinator's store).

The calls whose answer the engine does not use (write_behind.DEFERRED: an attempt started
or ended, a node's answer) are queued and return at once; a writer thread makes what has
gathered in one transaction, so a unit costs the ledger a share of one commit instead of
three commits, and the round's workers do not queue on the store's lock. Any other call
(planning a round, recording it, ending the run, a query) first makes everything queued
before it, so the file sees the calls in the order they were made, and a round is
recorded only after every write of its units. Refusals and failures are handled as
coordinator/write_behind.py says; a batch with a refusal in it is made again one call per
transaction, so only the refused call is left out. Calls inside `batch()` are made at
once, as part of it.
"""

from __future__ import annotations

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


class SqliteWrites:
    """The deferred calls of an SQLite ``store``; ``in_one_transaction(calls)`` makes a
    batch of them in one transaction (a refusal undoes the whole batch)."""

    def __init__(self, store: Any, in_one_transaction: Callable[[list[Call]], None]) -> None:
        self._store = store
        self._in_one_transaction = in_one_transaction
        self._batches = BatchDepth()
        self.writes = WriteBehind(self._apply, name="sqlite-writer")

    def batch(self) -> AbstractContextManager[None]:
        return self._batches.inside()

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Queue a deferred call; make any other after everything queued before it."""
        if self._batches.depth:
            return method(self._store, *args, **kwargs)
        if method.__name__ in DEFERRED:
            self.writes.put((method, args, kwargs))
            return None
        run_id = run_of((method, args, kwargs))
        if run_id is not None and method.__name__ in NEW_LIFE:
            self.writes.forget(run_id)
        self.writes.flush(run_id=run_id)
        return method(self._store, *args, **kwargs)

    def before_read(self) -> None:
        """A query reads what was written: everything queued is made first (not inside a
        batch, whose thread holds the store: what it queued before is made already)."""
        if not self._batches.depth:
            self.writes.flush(quiet=True)

    def close(self, flush: bool) -> None:
        self.writes.close(flush=flush)

    def _apply(self, calls: list[Call]) -> None:
        try:
            self._in_one_transaction(calls)
            return
        except StoreUnavailable:
            raise
        except (RunStoreError, ValueError):
            pass  # a refusal somewhere in the batch: find it
        for call in calls:
            method, args, kwargs = call
            try:
                method(self._store, *args, **kwargs)
            except StoreUnavailable:
                raise
            except (RunStoreError, ValueError) as exc:
                self.writes.refused(call, exc)
