"""The run store on a real PostgreSQL server: every ledger test of the SQLite store, run
again on PostgreSQL, and what PostgreSQL adds (run files, the schema check, fencing)."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from coordinator.postgres_store import (
    FILE_PART_BYTES,
    SCHEMA_VERSION,
    ConnectionLost,
    LeadershipLost,
    NotLeading,
    PostgresRunStore,
    redacted,
)
from coordinator.run_store import RunStoreError, SchemaError, StoreUnavailable
from tests.unit import test_run_store as sqlite_tests
from tests.unit.test_run_store import FakeClock, clock, store  # noqa: F401 - fixtures


def _shared_ledger_tests() -> dict[str, Callable]:
    """The SQLite store's tests that reach it only through the `store` or `new_store`
    fixtures, which this module points at PostgreSQL."""
    tests = {}
    for name, test in vars(sqlite_tests).items():
        if name.startswith("test_") and callable(test):
            wanted = set(inspect.signature(test).parameters)
            if wanted & {"store", "new_store"} and "tmp_path" not in wanted:
                tests[name] = test
    return tests


globals().update(_shared_ledger_tests())


@pytest.fixture
def new_store(postgres_url: str) -> Callable[..., PostgresRunStore]:
    return lambda clock_=time.time: PostgresRunStore(postgres_url, clock=clock_,
                                                     defer_writes=False)


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresRunStore]:
    with PostgresRunStore(postgres_url, clock=FakeClock(), defer_writes=False) as opened:
        opened.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        yield opened


def test_the_shared_tests_are_all_here() -> None:
    assert len(_shared_ledger_tests()) >= 18


def test_everything_survives_close_and_reopen(pg: PostgresRunStore, postgres_url: str) -> None:
    pg.plan_units("r1", 1, ["a", "b"])
    pg.unit_started("r1", 1, "a", 1, "n1:1")
    pg.unit_finished("r1", 1, "a", 1, "n1:1", "completed")
    pg.record_round("r1", 1, validation_error=float("nan"), validation_loss=1.0,
                    train_loss=0.5, seconds=1.0, completed_units=1, discarded_units=0)
    pg.close()
    with PostgresRunStore(postgres_url) as again:
        assert again.get_run("r1").rounds_done == 1
        assert again.list_rounds("r1")[0].validation_error is None  # NaN stored as NULL
        assert again.ledger_counts("r1") == {**dict.fromkeys(sqlite_tests.UNIT_STATUSES, 0),
                                             "completed": 1, "cancelled": 1}


def test_a_closed_store_says_so(postgres_url: str) -> None:
    closed = PostgresRunStore(postgres_url)
    closed.close()
    closed.close()
    with pytest.raises(RunStoreError, match="is closed"):
        closed.list_runs()


def test_a_newer_schema_version_is_refused(postgres_url: str) -> None:
    PostgresRunStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
        PostgresRunStore(postgres_url)


def test_a_database_holding_other_tables_is_refused(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(SchemaError, match="1 tables but no run store"):
        PostgresRunStore(postgres_url)


def test_an_unreachable_server_is_a_clear_error(postgres_server) -> None:
    url = f"postgresql://trainer:secret@127.0.0.1:{postgres_server.port}/no_such_db"
    with pytest.raises(RunStoreError, match='database "no_such_db" does not exist') as error:
        PostgresRunStore(url, connect_seconds=2)
    assert "secret" not in str(error.value)
    assert redacted(url) == f"postgresql://trainer:***@127.0.0.1:{postgres_server.port}/no_such_db"


def test_two_stores_creating_the_schema_at_once_agree(postgres_url: str) -> None:
    opened, errors = [], []

    def open_one() -> None:
        try:
            opened.append(PostgresRunStore(postgres_url))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(opened) == 3
    for each in opened:
        each.close()


@pytest.mark.parametrize("size", [0, 1000, FILE_PART_BYTES + 5])
def test_run_files_come_back_byte_for_byte(pg: PostgresRunStore, tmp_path: Path,
                                           size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (tmp_path / "checkpoint.npz").write_bytes(data)
    pg.store_file("r1", "checkpoint.npz", tmp_path / "checkpoint.npz")
    pg.store_file("r1", "request.json", tmp_path / "checkpoint.npz")
    (tmp_path / "checkpoint.npz").write_bytes(data[: size // 2])  # replaced, not appended
    pg.store_file("r1", "checkpoint.npz", tmp_path / "checkpoint.npz")
    out = tmp_path / "elsewhere"
    assert pg.restore_files("r1", out) == ["checkpoint.npz", "request.json"]
    assert (out / "checkpoint.npz").read_bytes() == data[: size // 2]
    assert (out / "request.json").read_bytes() == data
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "request.json"]


def test_a_fenced_store_writes_only_while_its_epoch_is_the_newest(
        pg: PostgresRunStore, postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE leader SET epoch = 7")
    pg.fence(7)
    pg.plan_units("r1", 1, ["a"])
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute("UPDATE leader SET epoch = 8")  # another coordinator took the lead
    with pytest.raises(LeadershipLost, match="epoch 8, this coordinator's 7"):
        pg.plan_units("r1", 1, ["b"])
    assert isinstance(LeadershipLost("x"), StoreUnavailable)
    assert pg.ledger_counts("r1")["pending"] == 1  # reads go on; nothing was written
    pg.fence(None)
    with pytest.raises(NotLeading, match="stands by"):
        pg.plan_units("r1", 1, ["b"])


def test_a_takeover_waits_for_the_write_in_progress(pg: PostgresRunStore,
                                                    postgres_url: str) -> None:
    """The share lock on the leader row: a new epoch lands between two of the old
    leader's transactions, never inside one."""
    pg.fence(0)
    with pg.batch():
        pg.plan_units("r1", 1, ["a"])
        with psycopg.connect(postgres_url, autocommit=True) as db:
            db.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                db.execute("UPDATE leader SET epoch = epoch + 1")
    assert pg.ledger_counts("r1")["pending"] == 1


def test_a_call_rides_out_a_restart_and_fails_past_the_bound(postgres_server,
                                                            postgres_url: str) -> None:
    with PostgresRunStore(postgres_url, outage_seconds=1.0) as opened:
        opened.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        postgres_server.restart()
        opened.plan_units("r1", 1, ["a"])  # made again on a new connection
        postgres_server.stop()
        try:
            with pytest.raises(ConnectionLost, match=r"for 1 s \(--store-outage\): the run "
                                                     "can be resumed once it is back"):
                opened.plan_units("r1", 1, ["b"])
            assert opened.unreachable_since is not None
        finally:
            postgres_server.start()
        opened.plan_units("r1", 1, ["b"])
        assert opened.unreachable_since is None
        assert opened.ledger_counts("r1")["pending"] == 2


def _unit_paths(target: PostgresRunStore, units: list[str]) -> None:
    target.create_run("r1", algorithm="a", model="m", dataset="d", rounds=2)
    target.plan_units("r1", 1, units)
    for i, unit in enumerate(units):
        target.unit_started("r1", 1, unit, 1, "n1:1")
        if i % 3 == 0:
            target.unit_finished("r1", 1, unit, 1, "n1:1", "failed", "boom")
            target.unit_started("r1", 1, unit, 2, "n2:2")
            target.unit_finished("r1", 1, unit, 2, "n2:2", "completed")
        else:
            target.unit_finished("r1", 1, unit, 1, "n1:1", "completed")
        target.node_answer("r1", "n1:1", "completed", False, 10)


def _moves(history: list) -> list[tuple]:
    return [(e.attempt, e.node, e.from_status, e.to_status) for e in history]


def _commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as db:
        return db.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = "
                          "current_database()").fetchone()[0]


def test_deferred_writes_leave_what_direct_ones_leave_in_far_fewer_transactions(
        postgres_server, postgres_url: str) -> None:
    units = [f"u{i}" for i in range(60)]
    with PostgresRunStore(postgres_url, defer_writes=False) as direct:
        _unit_paths(direct, units)
        expected = (direct.ledger_counts("r1"), direct.unit_history("r1", 1, "u3"),
                    direct.node_stats("r1"))
    other = postgres_url + "_deferred"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {other.rsplit('/', 1)[1]}")
    with PostgresRunStore(other) as deferred:
        before = _commits(other)
        _unit_paths(deferred, units)
        seen = (deferred.ledger_counts("r1"), deferred.unit_history("r1", 1, "u3"),
                deferred.node_stats("r1"))
        calls = 2 + len(units) * 3 + len(units) // 3 * 2
        assert _commits(other) - before < calls / 4  # batches, not a transaction per call
    assert seen[0] == expected[0] and _moves(seen[1]) == _moves(expected[1])
    assert [(n.node, n.accepted, n.samples) for n in seen[2]] == [
        (n.node, n.accepted, n.samples) for n in expected[2]]


def test_a_refused_deferred_write_is_raised_by_the_next_call_and_spares_the_others(
        postgres_url: str) -> None:
    with PostgresRunStore(postgres_url) as deferred:
        deferred.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        deferred.plan_units("r1", 1, ["a", "b"])
        deferred.unit_started("r1", 1, "a", 1, "n1:1")
        deferred.unit_started("r1", 1, "a", 1, "n1:1")  # the same attempt twice: a bug
        deferred.unit_started("r1", 1, "b", 1, "n1:1")
        with pytest.raises(ValueError, match="attempt 1 was already started"):
            deferred.attempts_so_far("r1", 1)  # strict mode (the tests'): raised here
        assert deferred.attempts_so_far("r1", 1) == {"a": 1, "b": 1}


def test_a_fenced_deferred_write_stops_every_later_call(postgres_url: str) -> None:
    with PostgresRunStore(postgres_url) as deferred:
        deferred.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        deferred.plan_units("r1", 1, ["a"])
        deferred.fence(0)
        with psycopg.connect(postgres_url, autocommit=True) as db:
            db.execute("UPDATE leader SET epoch = 1")
        deferred.unit_started("r1", 1, "a", 1, "n1:1")
        with pytest.raises(LeadershipLost):
            deferred.record_round("r1", 1, validation_error=0.5, validation_loss=1.0,
                               train_loss=1.0, seconds=1.0, completed_units=0,
                               discarded_units=0)
        with pytest.raises(LeadershipLost):
            deferred.unit_finished("r1", 1, "a", 1, "n1:1", "completed")
        assert deferred.ledger_counts("r1")["pending"] == 1  # nothing was written
