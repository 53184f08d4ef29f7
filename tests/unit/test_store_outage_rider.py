"""How long the PostgreSQL store's calls ride out a database that is away: --store-outage
counts from the outage's start, whichever call met it first, not afresh for each call
(a run whose write-behind queue rode out the outage then fails at its own next call).
A virtual clock: every try at the database takes a connection timeout's seconds."""

from __future__ import annotations

from typing import Any

import pytest

from thrift_trainer.coordinator.store_outage import RETRY_SECONDS, ConnectionLost, OutageRider
from thrift_trainer.engine import runtime

TRY_SECONDS = 1.5  # what one try waits for a connection that never comes
OUTAGE = 2.0


class VirtualClock(runtime.SystemRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class AwayDatabase:
    """A store whose every call tries for TRY_SECONDS and finds the database away."""

    path = "postgresql://trainer@127.0.0.1/test"

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.tries = 0

    def read(self) -> None:
        self.tries += 1
        self.clock.now += TRY_SECONDS
        raise ConnectionLost("the database cannot be reached")


@pytest.fixture
def clock() -> Any:
    with runtime.installed(VirtualClock()) as installed:
        yield installed


def rider_of(store: AwayDatabase) -> OutageRider:
    return OutageRider(store, OUTAGE, defer_writes=False, in_one_transaction=lambda calls: None,
                       keep_later=lambda call: None)


def test_the_first_call_rides_out_the_outage_then_fails_naming_the_flag(clock) -> None:
    store = AwayDatabase(clock)
    rider = rider_of(store)
    started = clock.now
    with pytest.raises(ConnectionLost, match=r"for 2 s \(--store-outage\)"):
        rider.call(AwayDatabase.read)
    # a broken connection is tried again at once, then every RETRY_SECONDS past the limit
    assert store.tries == 3
    assert clock.now - started == pytest.approx(3 * TRY_SECONDS + RETRY_SECONDS)
    assert rider.unreachable_since == started + TRY_SECONDS
    rider.writes.close(flush=False)


def test_a_call_made_once_the_outage_is_past_its_limit_fails_at_its_first_try(clock) -> None:
    store = AwayDatabase(clock)
    rider = rider_of(store)
    with pytest.raises(ConnectionLost):
        rider.call(AwayDatabase.read)
    tries_before = store.tries
    with pytest.raises(ConnectionLost, match=r"--store-outage"):
        rider.call(AwayDatabase.read)
    assert store.tries == tries_before + 1
    rider.writes.close(flush=False)
