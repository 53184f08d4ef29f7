"""The SQLite run store: persistence, the unit life cycle, ledger counts, threads, schema."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from thrift_trainer.coordinator.run_store import (
    SCHEMA_VERSION,
    UNIT_STATUSES,
    IllegalTransition,
    RunStore,
    RunStoreError,
    SchemaError,
    StoreUnavailable,
    UnknownRecord,
)

UNITS = [f"train_letters{i}.txt" for i in range(1, 4)]
A, B = "node1:9091", "node2:9092"
METRICS = dict(validation_error=0.5, validation_loss=1.5, train_loss=1.2, seconds=2.0,
               completed_units=2, discarded_units=0)


class FakeClock:
    """Time that moves only when a test says so: ages without sleeping."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def new_store(tmp_path: Path) -> Callable[..., RunStore]:
    """Opens the store the tests of both databases share (the contract tests override it)."""
    return lambda clock=time.time: RunStore(tmp_path / "runs.db", clock=clock)


@pytest.fixture
def store(new_store: Callable[..., RunStore], clock: FakeClock):
    with new_store(clock) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2,
                     config={"epochs": 5}, policy=2)
        s.plan_units("r1", 1, UNITS)
        yield s


def raw_sql(path: Path | str, sql: str, params: tuple = ()) -> list[tuple[Any, ...]]:
    """Read or change the file behind the store's back, as another tool would."""
    with closing(sqlite3.connect(path)) as db, db:
        return db.execute(sql, params).fetchall()


def store_sql(store: RunStore, sql: str, params: tuple = ()) -> list[tuple[Any, ...]]:
    """raw_sql on the database behind ``store``: its file, or its PostgreSQL server (the
    contract tests, tests/integration/test_run_store_contract.py, run these there too)."""
    url = getattr(store, "url", None)
    if url is None:
        return raw_sql(store.path, sql, params)
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        cursor = db.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def history(store: RunStore, unit_id: str, round_index: int = 1) -> list[tuple]:
    return [(e.attempt, e.node, e.from_status, e.to_status, e.attempt_status)
            for e in store.unit_history("r1", round_index, unit_id)]


# ------------------------------------------------------------- persistence
def test_everything_survives_close_and_reopen(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path, clock=clock) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=1,
                     config={"epochs": 5, "hidden": [20]}, policy=3)
        s.plan_units("r1", 1, UNITS)
        s.unit_started("r1", 1, UNITS[0], 1, A)
        s.unit_finished("r1", 1, UNITS[0], 1, A, "completed")
        s.node_answer("r1", A, "completed", delayed=True, samples=1800)
        s.record_round("r1", 1, **METRICS)
        clock.now += 5
        s.end_run("r1", "completed", "done")
    with RunStore(str(path)) as s:
        run = s.get_run("r1")
        assert run is not None
        assert (run.state, run.message, run.ended, run.rounds_done) == ("completed", "done",
                                                                       1005.0, 1)
        assert run.config == {"epochs": 5, "hidden": [20]} and run.policy == 3
        assert s.ledger_counts("r1")["completed"] == 1
        assert s.ledger_counts("r1")["cancelled"] == 2  # the round's leftovers
        assert [e.to_status for e in s.unit_history("r1", 1, UNITS[0])] == [
            "pending", "in_progress", "completed"]
        assert s.list_rounds("r1")[0].validation_error == 0.5
        assert s.node_stats("r1")[0].samples == 1800


def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    RunStore(tmp_path / "runs.db").close()
    assert raw_sql(tmp_path / "runs.db", "PRAGMA journal_mode") == [("wal",)]
    assert raw_sql(tmp_path / "runs.db", "SELECT version FROM schema_version") == [
        (SCHEMA_VERSION,)]


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    s = RunStore(tmp_path / "runs.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(RunStoreError, match="closed"):
        s.get_run("r1")


# ---------------------------------------------------------------- schema
def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is not an SQLite file, just some text\n" * 100)
    with pytest.raises(SchemaError, match="not a run store.*not a database"):
        RunStore(path)


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    RunStore(path).close()
    raw_sql(path, "UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaError, match=f"version {SCHEMA_VERSION + 1}, newer"):
        RunStore(path)


def test_a_directory_is_an_open_error_not_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(RunStoreError, match="cannot open the run store") as caught:
        RunStore(tmp_path)
    assert not isinstance(caught.value, SchemaError)


def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw_sql(path, "CREATE TABLE photos (id INTEGER)")
    with pytest.raises(SchemaError, match="not a run store.*photos"):
        RunStore(path)


# ------------------------------------------------------------------- runs
def test_list_runs_newest_first_with_a_limit(new_store: Callable[..., RunStore],
                                             clock: FakeClock) -> None:
    with new_store(clock) as s:
        for i, step in enumerate([0, 10, 0, 5]):  # run-2 ties with run-1: insertion decides
            clock.now += step
            s.create_run(f"run-{i}", algorithm="a", model="m", dataset="d", rounds=1)
        assert [r.run_id for r in s.list_runs()] == ["run-3", "run-2", "run-1", "run-0"]
        assert [r.run_id for r in s.list_runs(limit=2)] == ["run-3", "run-2"]
        with pytest.raises(ValueError, match="limit"):
            s.list_runs(limit=0)
        assert s.get_run("nope") is None


def test_run_ids_are_unique_and_runs_end_once(store: RunStore) -> None:
    with pytest.raises(ValueError, match="already exists"):
        store.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
    assert store.end_run("r1", "cancelled", "by the client") == len(UNITS)
    with pytest.raises(IllegalTransition, match="from cancelled to failed"):
        store.end_run("r1", "failed")
    with pytest.raises(ValueError, match="ends as one of"):
        store.end_run("r1", "running")
    with pytest.raises(UnknownRecord):
        store.end_run("nope", "failed")
    with pytest.raises(IllegalTransition, match="cancelled: cannot plan"):
        store.plan_units("r1", 2, ["x"])


def test_unfinished_runs_are_failed_at_start_up(store: RunStore) -> None:
    store.create_run("r2", algorithm="a", model="m", dataset="d", rounds=1)
    store.end_run("r2", "completed")
    assert store.fail_unfinished_runs() == ["r1"]
    run = store.get_run("r1")
    assert run is not None and (run.state, run.message) == ("failed",
                                                          "the coordinator restarted")
    assert store.unfinished_units("r1") == []


def test_a_run_that_ends_closes_its_live_attempts_and_ignores_their_answers(
        store: RunStore) -> None:
    store.unit_started("r1", 1, UNITS[0], 1, A)
    store.unit_started("r1", 1, UNITS[1], 1, B)
    assert store.fail_unfinished_runs("the coordinator stopped") == ["r1"]
    attempts = store_sql(store, "SELECT unit_id, status, reason, ended IS NOT NULL "
                                   "FROM attempts ORDER BY unit_id")
    assert attempts == [(UNITS[0], "cancelled", "the coordinator stopped", 1),
                        (UNITS[1], "cancelled", "the coordinator stopped", 1)]
    assert history(store, UNITS[0])[-1] == (1, A, "cancelled", "cancelled", "cancelled")
    # A straggler answering after the end changes nothing, and is not an error.
    assert store.unit_finished("r1", 1, UNITS[0], 1, A, "completed") == "cancelled"
    assert store.ledger_counts("r1")["completed"] == 0
    with pytest.raises(IllegalTransition, match="already ended"):  # not its node
        store.unit_finished("r1", 1, UNITS[0], 1, B, "completed")


def test_a_resumed_run_has_no_attempt_left_in_progress(store: RunStore) -> None:
    store.unit_started("r1", 1, UNITS[0], 1, A)
    store.end_run("r1", "failed", "crashed")
    store_sql(store, "UPDATE attempts SET status = 'in_progress'")  # as older code left it
    store.resume_run("r1", 0)
    assert store_sql(store, "SELECT status FROM attempts") == [("cancelled",)]
    assert store.attempts_so_far("r1", 1) == {UNITS[0]: 1}  # numbering goes on after it


def test_a_completed_run_is_taken_up_again_only_to_be_extended(store: RunStore) -> None:
    store.end_run("r1", "completed")
    with pytest.raises(IllegalTransition, match="completed: it cannot be resumed"):
        store.resume_run("r1", 2)
    assert store.resume_run("r1", 2, rounds=7) == 0
    record = store.get_run("r1")
    assert (record.state, record.rounds) == ("running", 7)


def test_a_full_disk_is_a_store_error_naming_the_file_and_leaves_no_half_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    RunStore(path).close()
    pages = raw_sql(path, "PRAGMA page_count")[0][0]
    monkeypatch.setenv("TRAINER_STORE_MAX_PAGES", str(pages + 2))
    with RunStore(path) as s:
        s.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        ids = [f"unit-{i:05d}-{'x' * 80}" for i in range(2000)]
        with pytest.raises(StoreUnavailable, match=rf"run store {path}: database or disk "
                                                   "is full"):
            s.plan_units("r1", 1, ids)
        assert s.ledger_counts("r1")["pending"] == 0  # all or nothing
        assert s.get_run("r1").state == "running"  # reads still work
        s.end_run("r1", "failed", "disk full")  # and small writes that fit
    assert raw_sql(path, "SELECT state FROM runs") == [("failed",)]


def test_a_round_is_recorded_once_and_settles_its_leftovers(store: RunStore) -> None:
    store.unit_started("r1", 1, UNITS[0], 1, A)
    store.unit_finished("r1", 1, UNITS[0], 1, A, "completed")
    store.unit_started("r1", 1, UNITS[1], 1, B)
    assert store.record_round("r1", 1, **METRICS) == 2
    assert store.ledger_counts("r1", 1)["cancelled"] == 2
    with pytest.raises(ValueError, match="already recorded"):
        store.record_round("r1", 1, **METRICS)
    # The attempt still out answers late: recorded, the unit stays cancelled; a result
    # the round no longer wanted cannot complete it, nor can a new attempt start.
    with pytest.raises(IllegalTransition, match="from cancelled to completed"):
        store.unit_finished("r1", 1, UNITS[1], 1, B, "completed")
    assert store.unit_finished("r1", 1, UNITS[1], 1, B, "cancelled") == "cancelled"
    with pytest.raises(IllegalTransition, match="from cancelled to in_progress"):
        store.unit_started("r1", 1, UNITS[2], 1, A)


# ------------------------------------------------------------ transitions
def test_planning_validates_unit_ids(store: RunStore) -> None:
    with pytest.raises(ValueError, match="already has units train_letters1"):
        store.plan_units("r1", 1, [UNITS[0]])
    with pytest.raises(ValueError, match="repeated: x"):
        store.plan_units("r1", 2, ["x", "y", "x"])
    with pytest.raises(ValueError, match="non-empty"):
        store.plan_units("r1", 2, [""])
    with pytest.raises(ValueError, match="numbered from 1"):
        store.plan_units("r1", 0, ["x"])
    with pytest.raises(UnknownRecord):
        store.plan_units("nope", 1, ["x"])
    assert store.plan_units("r1", 2, iter(UNITS)) == 3
    assert sum(store.ledger_counts("r1").values()) == 6


def test_the_latest_discard_says_which_unit_on_which_node_and_why(store: RunStore,
                                                                  clock: FakeClock) -> None:
    assert store.latest_discard("r1") is None
    for unit, node, seconds in ((UNITS[0], A, 1.0), (UNITS[1], B, 2.0)):
        clock.now += seconds
        store.unit_started("r1", 1, unit, 1, node)
        store.unit_finished("r1", 1, unit, 1, node, "discarded", reason="update norm too large")
    assert store.latest_discard("r1") == f"unit {UNITS[1]} on {B}: update norm too large"


@pytest.mark.parametrize(("ends", "final", "failures"), [
    (["completed"], "completed", 0),
    (["failed", "completed"], "completed", 1),
    (["stale", "completed"], "completed", 1),
    (["pending", "completed"], "completed", 0),  # rejected, then accepted elsewhere
    (["failed", "failed", "discarded"], "discarded", 3),
    (["cancelled"], "cancelled", 0),
])
def test_attempt_paths(store: RunStore, ends: list[str], final: str, failures: int) -> None:
    unit = UNITS[0]
    for attempt, end in enumerate(ends, start=1):
        store.unit_started("r1", 1, unit, attempt, A)
        assert store.unit_finished("r1", 1, unit, attempt, A, end, reason=f"#{attempt}") == end
    events = history(store, unit)
    assert [e[3] for e in events] == ["pending"] + [s for end in ends
                                                    for s in ("in_progress", end)]
    assert all(e[2] == prev[3] for prev, e in pairwise(events))  # a replayable chain
    assert store_sql(store, "SELECT status, attempts, failures, last_reason FROM units "
                   "WHERE unit_id = ?", (unit,)) == [(final, len(ends), failures,
                                                      f"#{len(ends)}")]
    assert store.ledger_counts("r1", 1)[final] == 1


def test_backup_attempts_keep_the_unit_in_progress(store: RunStore, clock: FakeClock) -> None:
    unit = UNITS[0]
    store.unit_started("r1", 1, unit, 1, A)
    clock.now += 30
    store.unit_started("r1", 1, unit, 2, B)  # backup while A sits in its load delay
    store.unit_started("r1", 1, unit, 3, A)
    assert store.unit_finished("r1", 1, unit, 3, A, "failed", "connection reset") == "in_progress"
    assert store.unit_finished("r1", 1, unit, 2, B, "completed") == "completed"
    # The loser answers after the winner: allowed only as failed, stale or cancelled.
    with pytest.raises(IllegalTransition, match="from completed to completed"):
        store.unit_finished("r1", 1, unit, 1, A, "completed")
    assert store.unit_finished("r1", 1, unit, 1, A, "cancelled") == "completed"
    store.unit_started("r1", 1, UNITS[1], 1, A)
    store.unit_started("r1", 1, UNITS[1], 2, B)
    store.unit_finished("r1", 1, UNITS[1], 1, A, "completed")
    assert store.unit_finished("r1", 1, UNITS[1], 2, B, "pending") == "completed"  # late reject
    assert history(store, unit)[-3:] == [
        (3, A, "in_progress", "in_progress", "failed"),
        (2, B, "in_progress", "completed", "completed"),
        (1, A, "completed", "completed", "cancelled"),
    ]


@pytest.mark.parametrize(("path", "final"), [
    (["cancelled"], "cancelled"),
    (["discarded"], "discarded"),
    (["start", "fail", "pending", "start", "fail", "discarded"], "discarded"),
    (["start", "fail", "cancelled"], "cancelled"),
    (["start", "stale", "start", "stale-end", "pending"], "pending"),
    (["start", "stale", "discarded"], "discarded"),
    (["start", "stale", "cancelled"], "cancelled"),
    (["start", "cancelled"], "cancelled"),
])
def test_unit_level_moves(store: RunStore, path: list[str], final: str) -> None:
    unit, attempt = UNITS[0], 0
    for step in path:
        if step == "start":
            attempt += 1
            store.unit_started("r1", 1, unit, attempt, A)
        elif step == "fail":
            store.unit_finished("r1", 1, unit, attempt, A, "failed")
        elif step == "stale-end":  # the timed-out attempt answers after the retry started
            store.unit_finished("r1", 1, unit, 1, A, "stale")
            store.unit_finished("r1", 1, unit, attempt, A, "stale")
        elif step == "stale":
            store.move_unit("r1", 1, unit, "stale", "no answer for 60 s")
        else:
            store.move_unit("r1", 1, unit, step)
    assert store_sql(store, "SELECT status FROM units WHERE unit_id = ?", (unit,)) == [
        (final,)]
    assert [e.to_status for e in store.unit_history("r1", 1, unit)][-1] == final


@pytest.mark.parametrize(("setup", "call", "states"), [
    ("completed", ("move", "pending"), ("completed", "pending")),
    ("completed", ("start",), ("completed", "in_progress")),
    ("discarded", ("start",), ("discarded", "in_progress")),
    ("cancelled", ("move", "pending"), ("cancelled", "pending")),
    ("pending", ("move", "completed"), ("pending", "completed")),
    ("pending", ("move", "in_progress"), ("pending", "in_progress")),
    ("in_progress", ("move", "pending"), ("in_progress", "pending")),
    ("failed", ("move", "stale"), ("failed", "stale")),
])
def test_illegal_transitions_name_both_states(store: RunStore, setup: str, call: tuple,
                                              states: tuple[str, str]) -> None:
    unit = UNITS[0]
    if setup != "pending":
        store.unit_started("r1", 1, unit, 1, A)
    if setup not in ("pending", "in_progress"):
        store.unit_finished("r1", 1, unit, 1, A, setup)
    before = history(store, unit)
    with pytest.raises(ValueError, match=f"from {states[0]} to {states[1]}"):
        if call[0] == "start":
            store.unit_started("r1", 1, unit, 2, B)
        else:
            store.move_unit("r1", 1, unit, call[1])
    assert history(store, unit) == before  # nothing written


def test_attempts_are_checked(store: RunStore) -> None:
    unit = UNITS[0]
    store.unit_started("r1", 1, unit, 1, A)
    with pytest.raises(ValueError, match="attempt 1 was already started"):
        store.unit_started("r1", 1, unit, 1, B)
    with pytest.raises(ValueError, match="runs on node1:9091, not node2:9092"):
        store.unit_finished("r1", 1, unit, 1, B, "completed")
    with pytest.raises(UnknownRecord, match="no attempt 7"):
        store.unit_finished("r1", 1, unit, 7, A, "completed")
    with pytest.raises(ValueError, match="not 'in_progress'"):
        store.unit_finished("r1", 1, unit, 1, A, "in_progress")
    with pytest.raises(ValueError, match="not 'done'"):
        store.unit_finished("r1", 1, unit, 1, A, "done")
    with pytest.raises(ValueError, match="unknown unit status"):
        store.move_unit("r1", 1, unit, "done")
    with pytest.raises(ValueError, match="numbered from 1"):
        store.unit_started("r1", 1, unit, 0, A)
    with pytest.raises(UnknownRecord, match="no unit nope"):
        store.unit_started("r1", 1, "nope", 1, A)
    store.unit_finished("r1", 1, unit, 1, A, "failed")
    with pytest.raises(IllegalTransition, match="from failed to completed; it already ended"):
        store.unit_finished("r1", 1, unit, 1, A, "completed")


def test_a_failing_call_inside_a_batch_undoes_only_itself(store: RunStore) -> None:
    with store.batch():
        store.unit_started("r1", 1, UNITS[0], 1, A)
        with pytest.raises(IllegalTransition):
            store.move_unit("r1", 1, UNITS[1], "completed")
        store.unit_started("r1", 1, UNITS[1], 1, A)
    assert store.ledger_counts("r1", 1)["in_progress"] == 2
    with pytest.raises(RuntimeError), store.batch():
        store.unit_finished("r1", 1, UNITS[0], 1, A, "completed")
        raise RuntimeError("the caller failed halfway")
    assert store.ledger_counts("r1", 1)["completed"] == 0


# ---------------------------------------------------------------- queries
def test_ledger_counts_add_up(store: RunStore) -> None:
    store.plan_units("r1", 2, [f"u{i}" for i in range(10)])
    store.unit_started("r1", 1, UNITS[0], 1, A)
    store.unit_started("r1", 1, UNITS[1], 1, A)
    store.unit_finished("r1", 1, UNITS[1], 1, A, "failed")
    for i in range(6):
        store.unit_started("r1", 2, f"u{i}", 1, B)
        store.unit_finished("r1", 2, f"u{i}", 1, B, "completed" if i < 4 else "stale")
    store.move_unit("r1", 2, "u9", "discarded")
    assert store.ledger_counts("r1", 1) == {**dict.fromkeys(UNIT_STATUSES, 0), "pending": 1,
                                            "in_progress": 1, "failed": 1}
    assert store.ledger_counts("r1", 2) == {**dict.fromkeys(UNIT_STATUSES, 0), "pending": 3,
                                            "completed": 4, "stale": 2, "discarded": 1}
    assert sum(store.ledger_counts("r1").values()) == 13
    assert store.ledger_counts("nope") == dict.fromkeys(UNIT_STATUSES, 0)


def test_unfinished_units_explain_a_stall(store: RunStore, clock: FakeClock) -> None:
    store.unit_started("r1", 1, UNITS[0], 1, A)  # t=1000, still out
    clock.now += 10
    store.unit_started("r1", 1, UNITS[1], 1, A)  # t=1010, fails at 1015
    clock.now += 5
    store.unit_finished("r1", 1, UNITS[1], 1, A, "failed", "node1: connection refused")
    clock.now += 25
    store.unit_started("r1", 1, UNITS[0], 2, B)  # backup at t=1040
    clock.now += 20  # now 1060
    rows = {u.unit_id: u for u in store.unfinished_units("r1")}
    first, second, third = (rows[u] for u in UNITS)
    assert (first.status, first.node, first.age_seconds, first.attempts,
            first.live_attempts) == ("in_progress", B, 20.0, 2, 2)
    assert (second.status, second.node, second.age_seconds, second.failures,
            second.last_reason) == ("failed", A, 45.0, 1, "node1: connection refused")
    assert (third.status, third.node, third.age_seconds, third.attempts) == ("pending", None,
                                                                             60.0, 0)
    assert [u.unit_id for u in store.unfinished_units("r1")] == [UNITS[2], UNITS[1], UNITS[0]]
    store.unit_finished("r1", 1, UNITS[0], 2, B, "failed")  # A's attempt owns it again
    owner = next(u for u in store.unfinished_units("r1") if u.unit_id == UNITS[0])
    assert (owner.node, owner.age_seconds, owner.live_attempts) == (A, 60.0, 1)


def test_node_counts_follow_the_node_pool(store: RunStore, clock: FakeClock) -> None:
    store.node_answer("r1", A, "completed", delayed=False, samples=100)
    store.node_answer("r1", A, "completed", delayed=True, samples=50)
    store.node_answer("r1", A, "rejected", delayed=False)
    store.node_answer("r1", A, "cancelled", delayed=True, samples=99)
    clock.now += 3
    store.node_failure("r1", A, "timed out")
    store.node_failure("r1", B)
    a, b = store.node_stats("r1")
    assert (a.node, a.accepted, a.rejected, a.delayed, a.failed, a.cancelled,
            a.samples) == (A, 2, 1, 2, 1, 1, 150)
    assert (a.last_answer, a.last_failure, a.last_reason) == (1000.0, 1003.0, "timed out")
    assert (b.accepted, b.failed, b.last_answer) == (0, 1, None)
    with pytest.raises(ValueError, match="answers one of"):
        store.node_answer("r1", A, "accepted", delayed=False)
    with pytest.raises(UnknownRecord):
        store.node_failure("nope", A)


# ---------------------------------------------------------------- threads
def test_eight_writer_threads_lose_nothing(store: RunStore) -> None:
    per_thread, errors = 60, []

    def work(t: int) -> None:
        try:
            ids = [f"t{t}-u{i}" for i in range(per_thread)]
            store.plan_units("r1", 2, ids)
            node = f"node{t}:9000"
            for i, unit in enumerate(ids):
                store.unit_started("r1", 2, unit, 1, node)
                if i % 3 == 0:  # a failure, then a retry that completes
                    store.unit_finished("r1", 2, unit, 1, node, "failed")
                    store.unit_started("r1", 2, unit, 2, node)
                    store.unit_finished("r1", 2, unit, 2, node, "completed")
                else:
                    store.unit_finished("r1", 2, unit, 1, node, "completed")
                store.node_answer("r1", node, "completed", delayed=False, samples=1)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    counts = store.ledger_counts("r1", 2)
    assert counts["completed"] == 8 * per_thread
    assert sum(counts.values()) == 8 * per_thread
    assert sum(n.samples for n in store.node_stats("r1")) == 8 * per_thread
    retried = sum(1 for i in range(per_thread) if i % 3 == 0)
    events = sum(len(store.unit_history("r1", 2, f"t{t}-u{i}"))
                 for t in range(8) for i in range(per_thread))
    assert events == 8 * (3 * per_thread + 2 * retried)


def test_a_run_s_counts_follow_its_units_through_every_move(store: RunStore) -> None:
    """The run's counts (kept as units change) equal its units counted afresh, through
    attempts, moves, a gathering into a later round, a failed end and a resume."""
    def counted_afresh() -> dict[str, int]:
        rows = store_sql(store, "SELECT status, COUNT(*) FROM units WHERE run_id = 'r1' "
                                "GROUP BY status")
        return {**dict.fromkeys(store.ledger_counts("r1"), 0), **dict(rows)}

    store.unit_started("r1", 1, UNITS[0], 1, A)
    store.unit_finished("r1", 1, UNITS[0], 1, A, "completed")
    store.unit_started("r1", 1, UNITS[1], 1, A)
    store.unit_finished("r1", 1, UNITS[1], 1, A, "failed", "refused")
    store.move_unit("r1", 1, UNITS[2], "discarded", "given up")
    store.plan_units("r1", 2, ["x", "y"])
    store.unit_started("r1", 2, "x", 1, B)
    assert store.ledger_counts("r1") == counted_afresh()
    assert store.gather_units("r1", 0, 2, "carried on") >= 1  # round 1's unsettled move
    assert store.ledger_counts("r1") == counted_afresh()
    store.end_run("r1", "failed", "killed")
    assert store.ledger_counts("r1") == counted_afresh()
    store.resume_run("r1", 0)
    assert store.ledger_counts("r1") == counted_afresh()
    assert sum(store.ledger_counts("r1").values()) == len(UNITS) + 2


def drop_unit_counts(db: sqlite3.Connection) -> None:
    """Make a file's schema one from before version 5 (no unit counts)."""
    for trigger in ("unit_counted", "unit_recounted", "unit_uncounted"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DROP TABLE unit_counts")


def test_a_version_4_file_counts_the_units_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    with RunStore(path) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        s.plan_units("r1", 1, ["a", "b", "c"])
        s.unit_started("r1", 1, "a", 1, A)
        s.unit_finished("r1", 1, "a", 1, A, "completed")
    with closing(sqlite3.connect(path)) as db, db:
        drop_unit_counts(db)
        db.execute("UPDATE schema_version SET version = 4")
    with RunStore(path) as s:
        before = s.ledger_counts("r1")
        s.plan_units("r1", 2, ["d"])
        after = s.ledger_counts("r1")
    assert (before["completed"], before["pending"], sum(before.values())) == (1, 2, 3)
    assert (after["completed"], after["pending"], sum(after.values())) == (1, 3, 4)
    assert raw_sql(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


def test_heartbeats_are_kept_per_node_and_a_version_1_file_gains_the_column(
        tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with RunStore(path) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=1)
        s.node_failure("r1", A, "refused")
    with closing(sqlite3.connect(path)) as db, db:  # make it a file of the first schema
        db.execute("ALTER TABLE nodes DROP COLUMN last_heartbeat")
        db.execute("ALTER TABLE units DROP COLUMN pass")
        db.execute("DROP TABLE privacy_charges")
        drop_unit_counts(db)
        db.execute("UPDATE schema_version SET version = 1")
    with RunStore(path) as s:
        s.node_heartbeats("r1", {A: 100.5, B: 101.0})
        s.node_heartbeats("r1", {A: 102.0})
        stats = {n.node: n for n in s.node_stats("r1")}
    assert stats[A].last_heartbeat == 102.0 and stats[A].failed == 1  # counts kept
    assert stats[B].last_heartbeat == 101.0 and stats[B].failed == 0


def test_a_version_2_file_gains_the_pass_column_and_keeps_its_units(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with RunStore(path) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        s.plan_units("r1", 1, ["a"])
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("ALTER TABLE units DROP COLUMN pass")
        db.execute("DROP TABLE privacy_charges")
        drop_unit_counts(db)
        db.execute("UPDATE schema_version SET version = 2")
    with RunStore(path) as s:
        s.plan_units("r1", 2, ["a.p1", "b.p1"], pass_index=1)
        assert s.pass_counts("r1") == {1: {"pending": 2}}
        assert s.ledger_counts("r1")["pending"] == 3


def test_a_version_3_file_gains_the_privacy_charges_and_keeps_its_rounds(
        tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with RunStore(path) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        s.record_round("r1", 1, **METRICS)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE privacy_charges")
        drop_unit_counts(db)
        db.execute("UPDATE schema_version SET version = 3")
    with RunStore(path) as s:
        assert s.charge_release("r1", 2, 1.5) == 1
        assert [r.round for r in s.list_rounds("r1")] == [1]
        assert [(c.charge, c.round, c.epsilon) for c in s.privacy_charges("r1")] == [
            (1, 2, 1.5)]
    assert raw_sql(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


def test_a_release_charged_twice_stays_charged_through_a_resume(store: RunStore,
                                                               clock: FakeClock) -> None:
    """Each computation of a round is charged, numbered in its run; a charge made once per
    round is not made again for a round that has one; a resume, which forgets the rounds
    after its checkpoint, forgets no charge."""
    assert store.privacy_charges("r1") == []
    assert store.charge_release("r1", 1, 0.5) == 1
    store.record_round("r1", 1, **METRICS)
    clock.now += 1
    assert store.charge_release("r1", 2, 0.75) == 2
    store.end_run("r1", "failed", "killed after round 2's unmask")
    store.resume_run("r1", 1)
    assert store.charge_release("r1", 2, 1.0) == 3  # round 2 computed again: seen twice
    assert store.charge_release("r1", 2, 1.0, once_per_round=True) == 3
    assert store.charge_release("r1", 3, 1.25, once_per_round=True) == 4
    charges = store.privacy_charges("r1")
    assert [(c.charge, c.round, c.epsilon) for c in charges] == [
        (1, 1, 0.5), (2, 2, 0.75), (3, 2, 1.0), (4, 3, 1.25)]
    assert charges[1].time == clock.now and charges[0].time == clock.now - 1
    assert [r.round for r in store.list_rounds("r1")] == [1]


def test_a_charge_without_a_finite_epsilon_reads_back_as_none_or_infinite(
        store: RunStore) -> None:
    store.charge_release("r1", 1, float("nan"))
    store.charge_release("r1", 2, float("inf"))
    assert [c.epsilon for c in store.privacy_charges("r1")] == [None, float("inf")]


def test_a_charge_for_an_unknown_run_is_refused(store: RunStore) -> None:
    with pytest.raises(UnknownRecord):
        store.charge_release("nope", 1, 0.5)
    assert store.privacy_charges("nope") == []


def test_gathered_units_keep_their_attempts_events_and_pass(
        new_store: Callable[..., RunStore]) -> None:
    with new_store() as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=3)
        s.plan_units("r1", 1, ["a.p1", "b.p1"], pass_index=1)
        s.unit_started("r1", 1, "a.p1", 1, A)
        s.unit_started("r1", 1, "b.p1", 1, B)
        s.unit_finished("r1", 1, "b.p1", 1, B, "completed")
        assert s.gather_units("r1", 0, 2, "carried on") == 1  # the unsettled one moves
        assert s.ledger_counts("r1", 1)["completed"] == 1
        assert s.ledger_counts("r1", 2)["in_progress"] == 1
        s.unit_finished("r1", 2, "a.p1", 1, A, "completed")  # its attempt moved with it
        assert [e.to_status for e in s.unit_history("r1", 2, "a.p1")] == [
            "pending", "in_progress", "in_progress", "completed"]
        assert s.pass_counts("r1") == {1: {"completed": 2}}
        with pytest.raises(ValueError, match="already has units a.p1"):
            s.plan_units("r1", 2, ["a.p1"], adopt=True, pass_index=1)  # settled: done once
        s.plan_units("r1", 2, ["c.p2"], pass_index=2)
        assert s.plan_units("r1", 2, ["c.p2", "d.p2"], adopt=True, pass_index=2) == 1
