"""The ledger on an SQL database, shared by the SQLite and the PostgreSQL store.

Both stores run the same ledger (coordinator/run_store.py's docstring tells its life
cycle) with the same statements (coordinator/ledger_sql.py, each store's placeholder)
and the same transactions: one at a time under the store's lock, nested calls as
savepoints, so a failing call inside batch() undoes only itself. What differs is left
to each store: its connections and how a transaction begins (`_connection`, `_begin`),
its driver's errors (`_unavailable_on_error`, `_IntegrityError`), its schema and its
migrations, and what it keeps besides the ledger (`_results_kept`, `_run_ended`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from thrift_trainer.coordinator.ledger_charges import ChargeWrites
from thrift_trainer.coordinator.ledger_queries import LedgerReads
from thrift_trainer.coordinator.ledger_sql import LedgerSql
from thrift_trainer.coordinator.ledger_steps import (
    check_text,
    close_attempts,
    move_unit_row,
    null_if_nan,
    run_state,
    settle,
)
from thrift_trainer.coordinator.ledger_units import UnitWrites
from thrift_trainer.coordinator.store_calls import rides_out_outages
from thrift_trainer.coordinator.store_protocol import Database
from thrift_trainer.coordinator.store_records import (
    END_STATES,
    MAX_LIST,
    UNSETTLED,
    IllegalTransition,
    RunStoreError,
)
from thrift_trainer.engine import runtime
from thrift_trainer.training.schema import rounds_problem


class SqlLedger(UnitWrites, ChargeWrites, LedgerReads):
    """The ledger's writes and transactions; see the module docstring. A store sets
    ``_q``, ``_IntegrityError`` and ``path``, and calls ``_start`` once connected."""

    _q: ClassVar[LedgerSql]
    _IntegrityError: ClassVar[type[Exception]]
    path: str
    unreachable_since: float | None = None  # a file is never away

    def _start(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = runtime.RLock()
        self._depth = 0  # transactions opened by the thread holding the lock
        # nested calls get savepoints; PostgreSQL's batched writes go without (one failing
        # call fails the batch, whose calls are then made one by one)
        self._savepoints = True
        self._db: Any = self._open()
        try:
            self._check_schema()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------- what each store does
    def _open(self) -> Database:
        raise NotImplementedError

    def _check_schema(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _begin(self, db: Any, write: bool) -> None:
        raise NotImplementedError

    @contextmanager
    def _unavailable_on_error(self) -> Iterator[None]:
        raise NotImplementedError
        yield  # pragma: no cover - a generator, as the stores' own are

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return method(self, *args, **kwargs)

    def _before_read(self) -> None:
        """Nothing: every write of this store is made when called."""

    def _connection(self) -> Any:
        if self._db is None:
            raise RunStoreError(f"the run store {self.path} is closed")
        return self._db

    # ------------------------------------------------------------ transactions
    def __enter__(self) -> SqlLedger:
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
    def _tx(self, write: bool = True) -> Iterator[Any]:
        """One transaction under the lock; nested calls become savepoints, so a failing
        call inside batch() undoes only itself. ``write``: the store may take its write
        lock up front (no lock upgrade to fail halfway); a reader reads a snapshot."""
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

    # ------------------------------------------------------------------- runs
    @rides_out_outages
    def create_run(self, run_id: str, *, algorithm: str, model: str, dataset: str,
                   rounds: int, config: Mapping[str, Any] | None = None,
                   policy: int | None = None) -> None:
        """Record a new run, state running; ValueError if the id is taken."""
        check_text("run id", run_id)
        problem = rounds_problem(rounds)
        if problem:
            raise ValueError(f"rounds: {problem}")
        config_json = json.dumps(dict(config or {}), sort_keys=True)
        with self._tx() as db:
            try:
                db.execute(self._q.create_run, (run_id, self._clock(), algorithm, model,
                                                dataset, rounds, config_json, policy))
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
        q = self._q
        with self._tx() as db:
            ids = [i for (i,) in db.execute(q.running_runs, (MAX_LIST,))]
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
        q = self._q
        with self._tx() as db:
            state = run_state(db, q, run_id)
            if state == "running" or (state == "completed" and rounds is None):
                raise IllegalTransition(f"run {run_id} is {state}: it cannot be resumed"
                                        + (" (extend it with more rounds)"
                                           if state == "completed" else ""))
            if rounds is not None:
                db.execute(q.set_rounds, (rounds, run_id))
            db.execute(q.run_again, (run_id,))
            close_attempts(db, q, run_id, "the coordinator stopped before it answered", now)
            kept = self._results_kept(db, run_id, from_round + 1)
            # the results those attempts brought died with the coordinator: never applied
            lost = [(r, u, a) for r, u, a in db.execute(
                q.completed_attempts_after, (run_id, from_round)) if (r, u) not in kept]
            db.executemany(q.stale_attempt,
                           [(f"its result was lost with the coordinator ({reason})", run_id,
                             r, u, a) for r, u, a in lost])
            db.execute(q.forget_rounds_after, (run_id, from_round))
            rows = [(r, u, s) for r, u, s in db.execute(q.units_after, (run_id, from_round))
                    if (r, u) not in kept]
            db.executemany(q.reopen_unit,
                           [(reason, now, run_id, r, u) for r, u, _ in rows])
            db.executemany(q.event_insert, [(run_id, r, u, None, None, s, "pending", None,
                                             reason, now) for r, u, s in rows])
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
        q = self._q
        with self._tx() as db:
            run_state(db, q, run_id)
            rows = db.execute(q.unsettled_after, (run_id, after_round, into_round,
                                                  *UNSETTLED)).fetchall()
            for round_index, unit_id, status in rows:
                move_unit_row(db, q, (run_id, round_index, unit_id), into_round)
                db.execute(q.event_insert, (run_id, into_round, unit_id, None, None, status,
                                            status, None, reason, now))
            return len(rows)

    @rides_out_outages
    def attempts_so_far(self, run_id: str, round_index: int) -> dict[str, int]:
        """Attempts already numbered per unit of a round (a reopened round has some), so
        new attempts continue the numbering."""
        with self._tx(write=False) as db:
            return dict(db.execute(self._q.attempts_so_far, (run_id, round_index)))

    def _results_kept(self, db: Any, run_id: str, round_index: int) -> set[tuple[int, str]]:
        """(round, unit) of the units of ``round_index`` completed with a kept result (none
        here); a store that keeps results also forgets the run's other ones (a resume)."""
        return set()

    def _run_ended(self, db: Any, run_id: str, state: str) -> None:
        """What a store does besides the ledger when a run ends (nothing here)."""

    def _end_run(self, db: Database, run_id: str, state: str,
                 message: str | None, now: float) -> int:
        q = self._q
        current = run_state(db, q, run_id)
        if current != "running":
            raise IllegalTransition(f"run {run_id}: cannot go from {current} to {state}")
        withdrawn = settle(db, q, run_id, None, message or f"run {state}", now)
        close_attempts(db, q, run_id, message or f"run {state}", now)
        db.execute(q.end_run, (state, message, now, run_id))
        self._run_ended(db, run_id, state)
        return withdrawn

    @rides_out_outages
    def record_round(self, run_id: str, round_index: int, *, validation_error: float,
                     validation_loss: float, train_loss: float, seconds: float,
                     completed_units: int, discarded_units: int) -> int:
        """Record a finished round's metrics. Its unsettled units (those the quorum did
        not wait for) become cancelled in the same transaction; returns how many."""
        now = self._clock()
        q = self._q
        with self._tx() as db:
            run_state(db, q, run_id)
            try:
                db.execute(q.record_round,
                           (run_id, round_index, *map(null_if_nan, (
                               validation_error, validation_loss, train_loss, seconds)),
                            completed_units, discarded_units, now))
            except self._IntegrityError:
                raise ValueError(f"round {round_index} of run {run_id} is already "
                                 "recorded") from None
            return settle(db, q, run_id, round_index, "round ended", now)


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
