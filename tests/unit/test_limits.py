"""wire.limits: connection slots, the frame budget and the refusal log."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.waiting import wait_until
from thrift_trainer.wire.limits import ConnectionSlots, FrameBudget, RefusalLog

WAIT = 10.0


def test_slots_cap_connections_per_peer_and_in_all():
    slots = ConnectionSlots(total=3, per_peer=2)
    assert slots.acquire("a") is None and slots.acquire("a") is None
    assert "a holds its limit of 2" in slots.acquire("a")
    assert slots.acquire("b") is None
    assert "limit of 3 connections" in slots.acquire("c")
    slots.release("a")
    assert slots.acquire("c") is None


def test_a_claim_that_does_not_fit_by_its_deadline_fails():
    budget = FrameBudget(10)
    assert budget.claim(8, time.monotonic() + WAIT)
    assert not budget.claim(3, time.monotonic() + 0.05)
    assert budget.claimed == 8 and budget.waiting == 0


def test_a_waiting_claim_gets_room_when_another_is_released():
    budget = FrameBudget(10)
    assert budget.claim(8, time.monotonic() + WAIT)
    granted: list[bool] = []
    waiter = threading.Thread(target=lambda: granted.append(budget.claim(5, time.monotonic()
                                                                          + WAIT)))
    waiter.start()
    assert wait_until(lambda: budget.waiting == 1, WAIT, alive=waiter.is_alive)
    budget.release(8)
    waiter.join(WAIT)
    assert granted == [True] and budget.claimed == 5


def test_claims_bigger_than_the_budget_take_all_of_it():
    budget = FrameBudget(10)
    assert budget.claim(50, time.monotonic() + WAIT)
    assert budget.claimed == 10
    budget.release(50)
    assert budget.claimed == 0


def test_one_address_claims_at_most_its_share_and_others_claim_the_rest():
    budget = FrameBudget(10, per_peer=4)
    assert budget.claim(4, time.monotonic() + WAIT, "attacker")
    assert not budget.claim(1, time.monotonic() + 0.05, "attacker")  # its share is full
    assert budget.claim(4, time.monotonic() + WAIT, "caller")
    budget.release(4, "attacker")
    assert budget.claim(1, time.monotonic() + WAIT, "attacker")
    assert budget.claimed == 5


def test_refusals_are_logged_once_per_interval_with_their_count(caplog):
    log = RefusalLog(port=1234, interval=WAIT * 100)
    with caplog.at_level(logging.WARNING, logger="wire.limits"):
        for _ in range(50):
            log.refused("too many")
    assert len(caplog.records) == 1
    assert "port 1234 refused 1 connection(s)" in caplog.records[0].getMessage()


def test_the_next_report_counts_the_refusals_not_logged(caplog, monkeypatch: pytest.MonkeyPatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    log = RefusalLog(port=1, interval=60.0)
    with caplog.at_level(logging.WARNING, logger="wire.limits"):
        for _ in range(5):
            log.refused("x")
        clock[0] += 61
        log.refused("y")
    assert [r.getMessage().split(" connection")[0] for r in caplog.records] == [
        "port 1 refused 1", "port 1 refused 5"]
