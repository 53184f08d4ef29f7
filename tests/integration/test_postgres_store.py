"""The run store on a real PostgreSQL server: what PostgreSQL adds (run files, kept
results, the schema check, fencing, outages). The ledger tests both backends share are
tests/integration/test_run_store_contract.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from tests.unit import test_run_store as sqlite_tests
from tests.unit.test_run_store import A, B, FakeClock
from tests.waiting import wait_until
from thrift_trainer.coordinator import postgres_keeping
from thrift_trainer.coordinator.kept_results import packed, unpacked
from thrift_trainer.coordinator.postgres_store import (
    FILE_PART_BYTES,
    SCHEMA_VERSION,
    ConnectionLost,
    LeadershipLost,
    NotLeading,
    PostgresRunStore,
    redacted,
)
from thrift_trainer.coordinator.run_store import RunStoreError, SchemaError, StoreUnavailable


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresRunStore]:
    with PostgresRunStore(postgres_url, clock=FakeClock(), defer_writes=False) as opened:
        opened.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        yield opened


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


def test_a_transaction_the_server_ended_before_its_commit_can_be_made_again(
        postgres_server, postgres_url: str) -> None:
    # a server shutting down ends idle sessions; its answer to the COMMIT that follows
    # says that nothing was committed, so the run goes on instead of failing
    with PostgresRunStore(postgres_url, defer_writes=False) as opened, \
            psycopg.connect(postgres_server.url, autocommit=True) as admin:
        opened.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        sessions = ("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                    "AND state = 'idle in transaction'")
        with pytest.raises(ConnectionLost) as cut, opened.batch():
            opened.plan_units("r1", 1, ["a"])
            (pid,) = admin.execute(sessions, (opened.application_name,)).fetchone()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert wait_until(lambda: admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                == (0,), 10)
        assert not cut.value.commit_unknown
        assert opened.ledger_counts("r1")["pending"] == 0
        opened.plan_units("r1", 1, ["a"])
        assert opened.ledger_counts("r1")["pending"] == 1


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


# ------------------------------------------------------------ kept results
def _keep(target: PostgresRunStore, round_index: int, unit: str, attempt: int,
          tensors: dict[str, np.ndarray]) -> None:
    target.keep_result("r1", round_index, unit, attempt, A, 40, 0.5, *packed(tensors))


def _round_with_results(target: PostgresRunStore) -> dict[str, np.ndarray]:
    """Round 1 checkpointed; round 2 with units a (kept), b (completed, its keeping not
    written: the leader died first) and c (out on a node)."""
    update = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "b": np.ones(2)}
    target.plan_units("r1", 1, ["a"])
    target.unit_started("r1", 1, "a", 1, A)
    target.unit_finished("r1", 1, "a", 1, A, "completed")
    _keep(target, 1, "a", 1, update)  # round 1's: a checkpoint covers it
    target.record_round("r1", 1, validation_error=0.5, validation_loss=1.0, train_loss=1.0,
                        seconds=1.0, completed_units=1, discarded_units=0)
    target.plan_units("r1", 2, ["a", "b", "c"])
    for unit in ("a", "b", "c"):
        target.unit_started("r1", 2, unit, 1, A)
    for unit in ("a", "b"):
        target.unit_finished("r1", 2, unit, 1, A, "completed")
    _keep(target, 2, "a", 1, update)
    return update


def test_a_resume_keeps_the_units_whose_result_is_kept_and_reopens_the_rest(
        pg: PostgresRunStore) -> None:
    update = _round_with_results(pg)
    assert pg.fail_unfinished_runs() == ["r1"]
    assert pg.resume_run("r1", 1) == 2  # b and c; a stays completed
    assert {u: pg.unit_history("r1", 2, u)[-1].to_status for u in "abc"} == {
        "a": "completed", "b": "pending", "c": "pending"}
    [kept] = pg.kept_results("r1", 2)
    assert (kept.unit_id, kept.attempt, kept.node, kept.num_samples, kept.loss) == (
        "a", 1, A, 40, 0.5)
    back = unpacked(kept.names, kept.data)
    assert back.keys() == update.keys() and all(
        back[k].dtype == update[k].dtype and np.array_equal(back[k], update[k]) for k in update)
    assert pg.kept_results("r1", 1) == []  # forgotten: the checkpoint of round 1 covers it
    assert pg.plan_units("r1", 2, ["a", "b", "c"]) == 0  # the reopened round, as it is
    assert pg.attempts_so_far("r1", 2) == {"a": 1, "b": 1, "c": 1}
    pg.unit_started("r1", 2, "b", 2, B)
    pg.unit_finished("r1", 2, "b", 2, B, "completed")
    pg.unit_started("r1", 2, "c", 2, B)
    pg.unit_finished("r1", 2, "c", 2, B, "completed")
    pg.end_run("r1", "completed")
    with psycopg.connect(pg.url) as db:
        assert db.execute("SELECT count(*) FROM kept_result_parts").fetchone()[0] == 0


def test_a_result_is_kept_once_by_the_attempt_that_completed_its_unit(
        pg: PostgresRunStore) -> None:
    update = _round_with_results(pg)
    with pytest.raises(ValueError, match="its result cannot be kept"):
        _keep(pg, 2, "a", 1, update)  # a second result for the unit
    _keep(pg, 2, "c", 1, update)  # kept, but its attempt never completed
    assert [k.unit_id for k in pg.kept_results("r1", 2)] == ["a"]
    pg.fail_unfinished_runs()
    assert pg.resume_run("r1", 1) == 2
    assert [k.unit_id for k in pg.kept_results("r1", 2)] == ["a"]


def test_a_checkpoint_lets_go_of_the_results_it_covers(pg: PostgresRunStore,
                                                       tmp_path: Path) -> None:
    _round_with_results(pg)
    (tmp_path / "checkpoint.npz").write_bytes(b"weights")
    pg.store_file("r1", "checkpoint.npz", tmp_path / "checkpoint.npz", round_index=1)
    assert [k.unit_id for k in pg.kept_results("r1", 2)] == ["a"]
    pg.store_file("r1", "checkpoint.npz", tmp_path / "checkpoint.npz", round_index=2)
    assert pg.kept_results("r1", 2) == []


def test_a_large_result_is_kept_in_parts(pg: PostgresRunStore) -> None:
    _round_with_results(pg)
    big = {"w": np.random.default_rng(1).standard_normal(FILE_PART_BYTES // 8 + 3)}
    _keep(pg, 2, "b", 1, big)
    with psycopg.connect(pg.url) as db:
        assert db.execute("SELECT count(*) FROM kept_result_parts WHERE unit_id = 'b'"
                          ).fetchone()[0] == 2
    kept = {k.unit_id: k for k in pg.kept_results("r1", 2)}
    assert np.array_equal(unpacked(kept["b"].names, kept["b"].data)["w"], big["w"])


def test_a_version_1_database_is_brought_up_to_date(postgres_url: str) -> None:
    PostgresRunStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as db:  # as version 1 left it
        db.execute("DROP TABLE privacy_charges")
        db.execute("DROP TABLE kept_result_parts")
        db.execute("DROP TABLE kept_results")
        db.execute("UPDATE schema_version SET version = 1")
    with PostgresRunStore(postgres_url, defer_writes=False) as migrated:
        migrated.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters",
                            rounds=2)
        _round_with_results(migrated)
        assert [k.unit_id for k in migrated.kept_results("r1", 2)] == ["a"]
        assert migrated.charge_release("r1", 2, 0.5) == 1
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION


def test_a_stream_s_results_are_taken_up_only_in_their_order_without_a_gap(
        pg: PostgresRunStore) -> None:
    """The versions a stream's results made come back only in the order they were kept:
    after a gap (a result whose keeping the leader's death cut off), none is taken up."""
    update = {"w": np.ones(3, dtype=np.float32)}
    pg.plan_units("r1", 2, ["a", "b", "c", "d"], pass_index=1)
    for unit in "abcd":
        pg.unit_started("r1", 2, unit, 1, A)
        pg.unit_finished("r1", 2, unit, 1, A, "completed")
    for sequence, unit in ((1, "b"), (0, "a"), (3, "d")):  # c's keeping never came
        pg.keep_result("r1", 2, unit, 1, A, 40, 0.5, *packed(update), sequence, 2)
    pg.fail_unfinished_runs()
    assert pg.resume_run("r1", 1) == 2  # c and d
    assert [(k.unit_id, k.sequence, k.staleness, k.pass_index)
            for k in pg.kept_results("r1", 2)] == [("a", 0, 2, 1), ("b", 1, 2, 1)]


def test_kept_results_are_written_apart_within_a_bound_and_never_after_the_lead_is_lost(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(postgres_keeping, "RESULTS_QUEUE_BYTES", 50_000)
    small, big = {"w": np.ones(10)}, {"w": np.ones(10_000)}  # 80 kB: past the bound
    with PostgresRunStore(postgres_url) as deferred:
        deferred.create_run("r1", algorithm="a", model="m", dataset="d", rounds=3)
        deferred.plan_units("r1", 2, ["a", "b", "c"])
        for unit in "abc":
            deferred.unit_started("r1", 2, unit, 1, A)
            deferred.unit_finished("r1", 2, unit, 1, A, "completed")
        deferred.fence(0)
        _keep(deferred, 2, "a", 1, small)
        _keep(deferred, 2, "b", 1, big)  # dropped, said once
        assert wait_until(lambda: [k.unit_id for k in deferred.kept_results("r1", 2)] == ["a"],
                          10.0)
        assert "results come faster than it writes them" in caplog.text
        with psycopg.connect(postgres_url, autocommit=True) as db:
            db.execute("UPDATE leader SET epoch = 1")  # another coordinator leads
        _keep(deferred, 2, "c", 1, small)
        assert wait_until(lambda: "1 kept results not written" in caplog.text, 10.0)
        assert "a newer leader holds it" in caplog.text
        assert [k.unit_id for k in deferred.kept_results("r1", 2)] == ["a"]


def test_kept_results_past_the_bound_in_all_are_kept_when_each_drains_first(
        postgres_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The bound is on what waits, not on what has passed through: results that together
    hold several times the bound, each kept once the one before it is written, are all
    kept, and none is said to be dropped."""
    monkeypatch.setattr(postgres_keeping, "RESULTS_QUEUE_BYTES", 50_000)
    units = [f"u{i}" for i in range(5)]
    updates = {unit: {"w": np.full(4_000, i, dtype=np.float64)}  # 32 kB each: 160 kB in all
               for i, unit in enumerate(units)}
    with PostgresRunStore(postgres_url) as deferred:
        deferred.create_run("r1", algorithm="a", model="m", dataset="d", rounds=3)
        deferred.plan_units("r1", 2, units)
        for unit in units:
            deferred.unit_started("r1", 2, unit, 1, A)
            deferred.unit_finished("r1", 2, unit, 1, A, "completed")
        deferred.fence(0)
        for written, unit in enumerate(units, 1):
            _keep(deferred, 2, unit, 1, updates[unit])
            assert wait_until(lambda n=written: len(deferred.kept_results("r1", 2)) == n,
                              10.0, alive=lambda: "faster than it writes" not in caplog.text
                              ), (unit, [k.unit_id for k in deferred.kept_results("r1", 2)],
                                  caplog.text)
        kept = deferred.kept_results("r1", 2)
    assert "results come faster than it writes them" not in caplog.text
    assert [k.unit_id for k in kept] == units
    assert all(np.array_equal(unpacked(k.names, k.data)["w"], updates[k.unit_id]["w"])
               for k in kept)
