"""The ledger's writes of units and nodes, shared by the SQLite and the PostgreSQL store
(see coordinator/run_store.py's docstring for the life cycle they check): a unit planned,
its attempts started and ended, moves without an attempt, and nodes' counts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from thrift_trainer.coordinator.ledger_sql import LedgerSql
from thrift_trainer.coordinator.ledger_steps import (
    after_attempt,
    check_live_attempt,
    check_new_units,
    check_text,
    check_unit_ids,
    name,
    run_state,
    unit_status,
    update_unit,
)
from thrift_trainer.coordinator.store_calls import rides_out_outages
from thrift_trainer.coordinator.store_records import (
    ATTEMPT_ENDS,
    MOVES,
    NODE_OUTCOMES,
    SETTLED,
    STARTABLE,
    UNIT_STATUSES,
    IllegalTransition,
    UnknownRecord,
)


class UnitWrites:
    """The writes of units and nodes; the store gives the statements, the clock, its
    transactions and its driver's IntegrityError."""

    _q: LedgerSql
    _clock: Callable[[], float]
    _IntegrityError: type[Exception]

    def _tx(self, write: bool = True) -> AbstractContextManager[Any]:
        raise NotImplementedError

    @rides_out_outages
    def plan_units(self, run_id: str, round_index: int, unit_ids: Iterable[str],
                   adopt: bool = False, pass_index: int | None = None) -> int:
        """Add a round's units as pending, all in one transaction; returns how many.
        ``adopt``: units the round already holds unsettled (reopened by a resume and
        gathered there) are taken as they are instead of refused. ``pass_index``: the
        pass over the data the units belong to (asynchronous modes)."""
        if round_index < 1:
            raise ValueError(f"rounds are numbered from 1, got {round_index}")
        ids = check_unit_ids(unit_ids)
        now = self._clock()
        q = self._q
        with self._tx() as db:
            state = run_state(db, q, run_id)
            if state != "running":
                raise IllegalTransition(f"run {run_id} is {state}: cannot plan units")
            ids = check_new_units(db, q, run_id, round_index, ids, adopt)
            db.executemany(q.plan_unit, [(run_id, round_index, u, now, now, pass_index)
                                         for u in ids])
            db.executemany(q.event_insert, [(run_id, round_index, u, None, None, None,
                                             "pending", None, None, now) for u in ids])
        return len(ids)

    @rides_out_outages
    def unit_started(self, run_id: str, round_index: int, unit_id: str, attempt: int,
                     node: str) -> None:
        """Open attempt `attempt` of a unit on `node`; the unit becomes in_progress."""
        check_text("node", node)
        if attempt < 1:
            raise ValueError(f"attempts are numbered from 1, got {attempt}")
        key = (run_id, round_index, unit_id)
        now = self._clock()
        q = self._q
        with self._tx() as db:
            current = unit_status(db, q, key)
            if current not in STARTABLE:
                raise IllegalTransition(f"{name(key)}: cannot go from {current} to in_progress")
            try:
                db.execute(q.start_attempt, (*key, attempt, node, now))
            except self._IntegrityError:
                raise ValueError(f"{name(key)}: attempt {attempt} was already "
                                 "started") from None
            db.execute(q.unit_in_progress, (node, now, *key))
            db.execute(q.event_insert, (*key, attempt, node, current, "in_progress",
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
        q = self._q
        with self._tx() as db:
            live = check_live_attempt(db, q, key, attempt, node, status)
            if live is None:  # closed when its run ended: nobody waits for this answer
                return unit_status(db, q, key)
            current, others_live = live
            new = after_attempt(key, current, status, others_live)
            db.execute(q.end_attempt, (status, now, reason, *key, attempt))
            if current not in SETTLED:  # a late attempt leaves its settled unit alone
                update_unit(db, q, key, new, status, node, reason, now)
            db.execute(q.event_insert, (*key, attempt, node, current, new, status, reason, now))
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
        q = self._q
        with self._tx() as db:
            current = unit_status(db, q, key)
            if status not in MOVES.get(current, frozenset()):
                raise IllegalTransition(f"{name(key)}: cannot go from {current} to {status}")
            db.execute(q.move_unit, (status, 1 if status == "stale" else 0, reason, now, *key))
            db.execute(q.event_insert, (*key, None, None, current, status, None, reason, now))

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
                check_text("node", node)
                db.execute(self._q.node_heartbeat, (run_id, node, when))

    def _node_upsert(self, run_id: str, node: str, counts: tuple[int, ...],
                     times: tuple[float | None, float | None, str | None]) -> None:
        check_text("node", node)
        with self._tx() as db:
            try:
                db.execute(self._q.node_upsert, (run_id, node, *counts, *times))
            except self._IntegrityError:
                raise UnknownRecord(f"no run {run_id!r}") from None
