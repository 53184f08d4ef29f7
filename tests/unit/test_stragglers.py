"""The straggler policy: backup thresholds, deadlines from measured unit times, re-issue."""

from __future__ import annotations

import threading
import time

import pytest

from tests.inprocess import LocalNode
from tests.unit.test_round_engine import build, engine, units
from thrift_trainer.engine.nodes.errors import AttemptAborted
from thrift_trainer.engine.policies import AdaptivePolicy, RoundRobinPolicy
from thrift_trainer.engine.round_engine import EngineSettings
from thrift_trainer.engine.stragglers import MEASURED_DEADLINE_FLOOR, backup_threshold
from thrift_trainer.engine.tasks import Task, TaskResult


def test_backup_threshold_is_four_unit_times_with_a_floor():
    measured = RoundRobinPolicy().measured_backups
    assert backup_threshold(None, None, measured) == 0.25
    assert backup_threshold(0.01, None, measured) == 0.25
    assert backup_threshold(0.5, None, measured) == pytest.approx(2.0)
    assert backup_threshold(0.01, 0.05, measured) == pytest.approx(0.05)


def test_adaptive_backup_threshold_follows_measured_unit_times():
    measured = AdaptivePolicy(0).measured_backups
    assert backup_threshold(None, None, measured) == 0.25  # nothing measured yet
    assert backup_threshold(0.04, None, measured) == pytest.approx(0.12)
    assert backup_threshold(0.001, None, measured) == pytest.approx(0.05)
    assert backup_threshold(0.04, 1.0, measured) == pytest.approx(1.0)  # an explicit floor wins


class HangingNode(LocalNode):
    """Answers its first units, then hangs: its calls end only when aborted."""

    def __init__(self, index: int, answers: int) -> None:
        super().__init__(index)
        self.answers = answers
        self.aborted: list[str] = []
        self._release = threading.Condition()

    def train(self, task: Task) -> TaskResult:
        with self._release:
            hangs = self.calls >= self.answers
        if not hangs:
            return super().train(task)
        with self._release:
            self.calls += 1
            count = len(self.aborted)
            self._release.wait_for(lambda: len(self.aborted) > count, timeout=60)
            raise AttemptAborted(self.aborted[-1])

    def abort(self, key: tuple[str, str, int], reason: str) -> bool:
        with self._release:
            self.aborted.append(reason)
            self._release.notify_all()
        return True


@pytest.mark.slow  # waits out the measured deadline's floor, a real 5 s
def test_a_hung_nodes_short_unit_is_reissued_after_a_deadline_from_its_unit_times():
    hanging, healthy = HangingNode(0, answers=2), LocalNode(1)
    eng, _, _ = engine([hanging, healthy], speculation=False)
    assert eng.stragglers.deadline(hanging) == EngineSettings.deadline_floor == 30.0
    began = time.monotonic()
    outcome = eng.run_round(1, units(8), 8, build)
    seconds = time.monotonic() - began
    assert outcome.completed == 8 and not outcome.failures
    own = hanging.unit_seconds()
    assert own is not None and own < 0.1  # short units, measured on the node itself
    deadline = eng.stragglers.deadline(hanging)
    assert deadline == max(MEASURED_DEADLINE_FLOOR,
                           EngineSettings.deadline_factor * own) <= 5.0
    assert hanging.aborted and all("deadline exceeded" in r for r in hanging.aborted)
    assert seconds < 15.0  # not held for the 30 s that applies before units are measured


def test_the_first_unit_deadline_stays_while_nothing_is_measured():
    eng, _, _ = engine([LocalNode(0)])
    assert eng.stragglers.deadline() == eng.stragglers.deadline(LocalNode(1)) == 30.0
    eng.stragglers.note_unit_time(0.05)  # the run's usual time, but not this node's own
    assert eng.stragglers.deadline(LocalNode(2)) == 30.0
