"""Liveness from heartbeats, and when an attempt is overdue."""

from __future__ import annotations

import threading
import time

import pytest

from tests.inprocess import LocalNode
from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.round_state import RoundState
from thrift_trainer.engine.stragglers import overdue_reason
from thrift_trainer.engine.tasks import TaskResult, TaskStatus
from thrift_trainer.training.units import UnitSpec

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


def test_a_unit_whose_node_reports_progress_is_not_reclaimed_until_progress_stops() -> None:
    node = LocalNode(0)
    node.stats.accepted = 1
    started = time.monotonic() - 100.0  # far past any deadline, yet working
    node.liveness.heard(progress={"r1/u1/1": 40})
    now = time.monotonic()
    assert overdue_reason(node, KEY, started, now, 5.0) is None
    node.liveness.heard(progress={"r1/u1/1": 40})  # heard again, but no batch more
    assert "no progress" in overdue_reason(node, KEY, started, now + 6.0, 5.0)
    node.liveness.heard(progress={"r1/u1/1": 41, "r1/u2/1": 7})  # one more: working again
    assert overdue_reason(node, KEY, started, time.monotonic() + 4.0, 5.0) is None


def test_the_deadline_follows_each_nodes_measured_unit_time() -> None:
    fast, slow, new = LocalNode(0), LocalNode(1), LocalNode(2)
    eng = RoundEngine("r1", [fast, slow, new], RoundRobinPolicy(),
                      EngineSettings(deadline_floor=1.0, deadline_factor=10.0,
                                     deadline_cap=300.0),
                      RunProgress("r1", 1, 1, list), threading.Event())
    for node, seconds in ((fast, 0.2), (slow, 8.0)):
        for _ in range(3):
            node.started()
            node.finished(_completed(seconds), seconds)
    assert eng.stragglers.deadline(fast) == pytest.approx(2.0)
    assert eng.stragglers.deadline(slow) == pytest.approx(80.0)  # a busy machine gets longer
    assert eng.stragglers.deadline(new) == eng.stragglers.deadline() == 1.0  # nothing measured yet


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, node, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        self.sent.append((node.name, run_id, unit_id, attempt))


class Stuck(LocalNode):
    """A node whose call is out and can be aborted, as a real connection can."""

    def abort(self, key, reason: str) -> bool:
        return True


def test_a_reclaimed_attempt_is_cancelled_on_its_node() -> None:
    node, cancels = Stuck(0), Recorder()
    node.stats.accepted = 1
    eng = RoundEngine("r1", [node], RoundRobinPolicy(), EngineSettings(deadline_floor=1.0),
                      RunProgress("r1", 1, 1, list), threading.Event(), cancels=cancels)
    state = RoundState(1, [UnitSpec("u1", "train_letters1.txt")], 1, max_attempts=2)
    unit = state.units[0]
    assert state.start_attempt(unit, node) == 1
    unit.started[1] = (node, time.monotonic() - 5.0)  # out for 5 s without progress
    eng.stragglers.reclaim(state)
    assert cancels.sent == [(node.name, "r1", "u1", 1)]


def _completed(seconds: float) -> TaskResult:
    return TaskResult(TaskStatus.COMPLETED, update={}, num_samples=1, model_version=1,
                      compute_seconds=seconds)
