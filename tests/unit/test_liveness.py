"""Liveness from heartbeats, and when an attempt is overdue."""

from __future__ import annotations

import time

from coordinator.node_pool import Liveness
from coordinator.round_engine import overdue_reason
from tests.inprocess import LocalNode

KEY = ("r1", "u1", 1)


def test_silence_makes_a_node_suspect_then_dead() -> None:
    live = Liveness(suspect=3.0, dead=10.0)
    now = time.monotonic()
    assert live.state(now) == "alive"
    assert live.state(now + 4) == "suspect"
    assert live.state(now + 11) == "dead"
    live.heard()
    assert live.state() == "alive"


def test_time_in_a_load_delay_does_not_count_against_the_deadline() -> None:
    node = LocalNode(0)
    node.stats.accepted = 1  # past its first unit
    started = time.monotonic() - 20.0
    assert "deadline exceeded" in overdue_reason(node, KEY, started, time.monotonic(), 5.0)
    node.liveness.heard(delaying=["r1/u1/1"])  # the node says: still in its load delay
    assert overdue_reason(node, KEY, started, time.monotonic(), 5.0) is None


def test_a_first_unit_gets_more_time_and_a_dead_node_loses_its_units() -> None:
    node = LocalNode(0)
    started = time.monotonic() - 12.0
    assert overdue_reason(node, KEY, started, time.monotonic(), 5.0) is None  # 4 x 5 s for a first
    node.liveness = Liveness(suspect=0.01, dead=0.02)
    assert "is dead" in overdue_reason(node, KEY, time.monotonic(), time.monotonic() + 1.0, 5.0)
