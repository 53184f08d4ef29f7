"""The engine's hot writes to a run store, made later and many at a time.

Every unit costs the ledger a few writes (started, finished, the node's answer), each a
transaction of several statements. A round trip to a database server is far dearer than a
call into SQLite: made one by one under the store's lock, they would slow a round of many
small units down to the database's pace. SQLite's commits are cheap but not free (a WAL
write each, and the workers queue on the store's lock meanwhile): a coordinator's SQLite
store defers the same calls (coordinator/sqlite_writes.py), so a unit costs the ledger a
part of a transaction instead of three. So the calls whose answer the engine does
not use (DEFERRED) are queued and return at once; a writer thread makes everything queued
in one transaction, its statements pipelined (psycopg's pipeline mode: only reads wait for
the server). Any other call first makes everything queued before it, in the caller's
thread, so the store sees the calls in the order they were made, and a round is recorded
only after every write of its units.

A call in a batch that the store refuses (a bug of the caller, as coordinator/run_store.py
says) fails the batch, which is then made one call per transaction: the refusal is logged
and, with TRAINER_STRICT_LEDGER=1, raised by the next call that does not wait. A write the
store could not make (StoreUnavailable, LeadershipLost) is kept and raised by every later
call of the same run (every deferred call's first argument is its run id), as the run
would see it from a direct call; a run created or resumed afterwards starts clean, so a
coordinator whose database stayed away past --store-outage trains again once it is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from thrift_trainer.engine.ledger import STRICT_ENV, RunStoreError, StoreUnavailable

log = logging.getLogger("coordinator.store")
DEFERRED = frozenset({"unit_started", "unit_finished", "move_unit", "node_answer",
                      "node_failure", "node_heartbeats"})
# calls that start a run afresh: the writes its earlier life could not make are behind it
NEW_LIFE = frozenset({"create_run", "resume_run"})
GATHER_SECONDS = 0.005  # the writer waits this long for more calls before a batch
MAX_BATCH = 2000

Call = tuple[Callable[..., Any], tuple, dict]


class BatchDepth(threading.local):
    """This thread's depth of a store's batch() blocks: a call inside one is made at once,
    as part of it (only the batch's caller can make it again)."""

    depth = 0

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


def run_of(call: Call) -> str | None:
    """The run a call writes for: its first argument (None for a call of no run)."""
    _, args, kwargs = call
    run_id = kwargs.get("run_id", args[0] if args else None)
    return run_id if isinstance(run_id, str) else None


class WriteBehind:
    """The queue of deferred calls and its writer thread. ``apply(calls)`` makes a batch
    (in one transaction, or one by one); ``one(call)`` makes a single call."""

    def __init__(self, apply: Callable[[list[Call]], None], name: str = "store-writer",
                 size_of: Callable[[Call], int] = lambda call: 0,
                 max_bytes: int | None = None) -> None:
        """``size_of(call)``: the bytes a queued call holds; ``max_bytes``: how many the
        queue may hold (None: no bound), past which `put` drops a call."""
        self._apply = apply
        self._size_of, self.max_bytes = size_of, max_bytes
        self.queued_bytes = 0
        self._queue: list[Call] = []
        self._changed = threading.Condition()
        self._flushing = threading.Lock()  # one batch at a time, in queue order
        self._closed = False
        # by run: the first write of each that could not be made
        self.failures: dict[str | None, StoreUnavailable] = {}
        self.refusal: Exception | None = None  # the first call refused (strict mode raises it)
        self._strict = os.environ.get(STRICT_ENV) == "1"
        self._thread = threading.Thread(target=self._write, name=name, daemon=True)
        self._thread.start()

    def put(self, call: Call) -> bool:
        """Queue a call; False when it would take the queue past ``max_bytes`` (dropped)."""
        self.raise_failure(run_of(call))
        size = self._size_of(call)
        with self._changed:
            if self.max_bytes is not None and self.queued_bytes + size > self.max_bytes:
                return False
            self.queued_bytes += size
            self._queue.append(call)
            # The writer waits for a first call, then lets more gather: waking it for each
            # call would cut the gathering short, at a thread switch a call.
            if len(self._queue) == 1 or len(self._queue) >= MAX_BATCH:
                self._changed.notify()
        return True

    def flush(self, quiet: bool = False, run_id: str | None = None) -> None:
        """Make every call queued so far, in this thread; then raise what went wrong with
        the writes of ``run_id`` (``quiet``: a query's flush, which leaves that to the
        writes)."""
        with self._flushing:
            while True:
                with self._changed:
                    calls, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                    self.queued_bytes -= sum(map(self._size_of, calls))
                if not calls:
                    break
                self._make(calls)
        if quiet:
            return
        self.raise_failure(run_id)
        if self._strict and self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            raise refusal

    def raise_failure(self, run_id: str | None) -> None:
        failure = self.failures.get(run_id)
        if failure is not None:
            raise failure

    def forget(self, run_id: str) -> None:
        """A run created or resumed: what its earlier writes met is behind it."""
        self.failures.pop(run_id, None)

    def close(self, flush: bool = True) -> None:
        """Stop the writer; ``flush``: make what is queued first (else it is dropped, as a
        process that dies loses it)."""
        if flush:
            try:
                self.flush()
            except (RunStoreError, ValueError) as exc:
                log.warning("run store: writes left unmade at close: %s", exc)
        with self._changed:
            self._closed = True
            self._queue, self.queued_bytes = [], 0
            self._changed.notify()
        self._thread.join(5.0)

    def _write(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                if len(self._queue) < MAX_BATCH:  # let a burst of calls gather
                    self._changed.wait(GATHER_SECONDS)
            # what goes wrong is kept (failure, refusal) for the calls that follow
            with contextlib.suppress(RunStoreError, ValueError):
                self.flush()

    def _make(self, calls: list[Call]) -> None:
        try:
            self._apply(calls)
        except StoreUnavailable as exc:
            runs = {run_of(call) for call in calls}
            if not runs <= self.failures.keys():
                log.error("%s", exc)
            for run_id in runs:
                self.failures.setdefault(run_id, exc)

    def refused(self, call: Call, exc: Exception) -> None:
        """A call of a batch that the store refused (see the module docstring)."""
        method, args, _ = call
        log.warning("run store refused %s%s: %s", method.__name__, args[:4], exc)
        self.refusal = self.refusal or exc
