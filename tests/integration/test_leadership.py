"""The lease and its fencing epoch (coordinator/leadership.py) on a real PostgreSQL: one
keeper leads, another takes over once the lease expires, the old one steps down, and a
busy leader's writes never hold up its own renewals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest

from tests.waiting import wait_until
from thrift_trainer.coordinator.handler import CoordinatorHandler
from thrift_trainer.coordinator.leadership import READ_WAIT_SECONDS, Leader, LeaseKeeper
from thrift_trainer.coordinator.postgres_store import (
    CONNECT_SECONDS,
    LeadershipLost,
    PostgresRunStore,
)
from thrift_trainer.coordinator.records import RunFailed
from thrift_trainer.coordinator.run import CoordinatorSettings
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.wire.generated import ttypes

LEASE = 0.5


class Events:
    def __init__(self) -> None:
        self.led: list[int] = []
        self.lost: list[Leader] = []


def keeper(store: PostgresRunStore, address: str, events: Events) -> LeaseKeeper:
    return LeaseKeeper(store, address, events.led.append, events.lost.append,
                       lease_seconds=LEASE)


def _expired(watcher: LeaseKeeper) -> None:
    """Wait (bounded) until the database's clock says the lease has expired."""
    assert wait_until(lambda: not watcher.leader().live, 10.0), "the lease never expired"


def _expiry(store: PostgresRunStore) -> object:
    with store.connection() as db:
        return db.execute("SELECT expires FROM lease WHERE id = 1").fetchone()[0]


@pytest.fixture
def stores(postgres_url: str) -> Iterator[tuple[PostgresRunStore, PostgresRunStore]]:
    first, second = PostgresRunStore(postgres_url), PostgresRunStore(postgres_url)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def test_one_leads_the_other_takes_over_once_the_lease_expires(stores) -> None:
    first, second = stores
    a, b = Events(), Events()
    ka, kb = keeper(first, "h1:1", a), keeper(second, "h2:2", b)
    ka.step()
    kb.step()
    assert (a.led, b.led) == ([1], [])
    assert kb.leader() == Leader("h1:1", 1, True)
    first.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)  # it writes
    with pytest.raises(Exception, match="stands by"):
        second.create_run("r2", algorithm="a", model="m", dataset="d", rounds=1)
    _expired(kb)  # the leader misses its renewals (paused)
    kb.step()
    assert b.led == [2] and kb.leader() == Leader("h2:2", 2, True)
    with pytest.raises(LeadershipLost, match="epoch 2, this coordinator's 1"):
        first.plan_units("r1", 1, ["u"])  # fenced before its keeper knows
    ka.step()  # its renewal finds the newer epoch
    assert [(x.address, x.epoch) for x in a.lost] == [("h2:2", 2)] and not ka.leading
    ka.step()  # and it does not take the live lease back
    assert a.led == [1]


def test_a_busy_leader_renews_while_it_writes(stores) -> None:
    first, second = stores
    a, b = Events(), Events()
    ka, kb = keeper(first, "h1:1", a), keeper(second, "h2:2", b)
    ka.step()
    first.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
    taken = _expiry(first)
    with first.batch():  # a write in progress share-locks the leader row
        first.plan_units("r1", 1, ["u"])
        began = time.monotonic()
        ka.step()  # the renewal
        assert time.monotonic() - began < LEASE
    assert _expiry(first) > taken  # renewed, not waiting behind the write
    kb.step()
    assert b.led == [] and ka.leading


def test_reading_who_leads_while_the_database_is_away_does_not_hold_the_answer(
        stores, postgres_server) -> None:
    # train()'s answer and status read who leads: with the database away they must not
    # wait the pool's whole connection timeout (CONNECT_SECONDS, 10 s) for it
    first, _ = stores
    ka = keeper(first, "h1:1", Events())
    ka.step()
    postgres_server.stop()
    try:
        began = time.monotonic()
        assert ka.leader() is None and not ka.superseded()  # unknown: still leading
        assert time.monotonic() - began < READ_WAIT_SECONDS + 4.0 < CONNECT_SECONDS
    finally:
        postgres_server.start()
    back = ka.leader()  # once it is back, read as before (the short lease has expired)
    assert back is not None and (back.address, back.epoch) == ("h1:1", 1)


def test_a_clean_stop_hands_the_lease_over_at_once(stores) -> None:
    first, second = stores
    a, b = Events(), Events()
    ka, kb = keeper(first, "h1:1", a), keeper(second, "h2:2", b)
    ka.step()
    ka.stop(release=True)
    kb.step()
    assert b.led == [2]


def test_a_takeover_ends_the_old_leader_s_session_stuck_mid_pipeline(stores,
                                                                     postgres_url: str) -> None:
    """A leader stopped between two statements of a pipeline holds its share lock with
    its session "active", which no server timeout ends: the new leader ends it."""
    first, second = stores
    a, b = Events(), Events()
    ka, kb = keeper(first, "h1:1", a), keeper(second, "h2:2", b)
    ka.step()
    stuck = psycopg.connect(postgres_url, autocommit=True,
                            application_name=first.application_name)
    stuck.execute("BEGIN")
    stuck.execute("SELECT epoch FROM leader WHERE id = 1 FOR SHARE")
    pipeline = stuck.pipeline()
    pipeline.__enter__()
    stuck.execute("SELECT 1")  # sent, no sync: the server waits for the rest
    stuck.pgconn.flush()
    _expired(kb)
    kb.step()
    assert b.led == [2]
    with pytest.raises(psycopg.OperationalError):
        pipeline.__exit__(None, None, None)
    stuck.close()


def test_a_run_cut_off_by_the_new_leader_sends_its_caller_to_that_leader(
        postgres_url: str, tmp_path: Path) -> None:
    """A leader's run that failed on a lost connection (the new leader ended its sessions
    while it was paused in a COMMIT) before its lease keeper noticed the takeover: its
    caller is told where the run goes on, not that the run failed."""
    (tmp_path / "nodes.txt").write_text("127.0.0.1,1\n")
    coordinator = CoordinatorHandler(tmp_path / "nodes.txt", CoordinatorSettings(
        data_root=DEFAULT_DATA_ROOT, run_root=tmp_path / "runs", policy=2,
        store_url=postgres_url, lease_seconds=60))
    try:
        coordinator.lead_when_elected("a:1")
        assert coordinator.leading
        with psycopg.connect(postgres_url, autocommit=True) as db:  # b takes over
            db.execute("UPDATE leader SET epoch = epoch + 1, holder = 'b', address = 'b:2'")
        run = SimpleNamespace(run_id="r1", ledger=SimpleNamespace(failure=None))
        with pytest.raises(ttypes.TrainingFailed) as failed:
            coordinator._answer(run, RunFailed("run store: terminating connection due to "
                                               "administrator command", nodes_tried=[]))
        assert (failed.value.leader, coordinator.leading) == ("b:2", False)
        assert "run r1 moved" in failed.value.message
    finally:
        coordinator.keeper.stop(release=False)
        coordinator.store.close()
