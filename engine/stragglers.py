"""Stragglers: when a unit is late, and what is done about it, in one policy object.

Three rules, all kept here so that changing how a straggler is handled touches one place:

* the **deadline**: how long an attempt may go without a sign of work before it is
  reclaimed. Once its node has measured unit times, `deadline_factor` (10) times the
  node's recent undelayed unit time, at least `MEASURED_DEADLINE_FLOOR` (5 s, or a lower
  `deadline_floor`): a hung node holds a 50 ms unit for 5 s, not for 30 s.
  Before the node has a unit time, the factor applies to the run's usual unit time and
  the floor is `deadline_floor` (30 s by default: a node's first units load libraries and
  build caches), and a node that has not answered a unit yet gets `FIRST_UNIT_GRACE`
  times as long. Never more than `deadline_cap`.
* the **backup threshold**: how long a unit may be out before a backup attempt of it
  starts on another node (`backup_threshold`).
* the **re-issue**: an attempt past its deadline, or on a dead node, is aborted and
  cancelled on its node (`reclaim`); its worker sees a failure and the work queue issues
  the unit again.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from typing import TYPE_CHECKING, Protocol

from thrift_trainer.engine import runtime
from thrift_trainer.engine.cancels import CancelSender
from thrift_trainer.engine.nodes.pool import NodeHandle

if TYPE_CHECKING:
    from thrift_trainer.engine.round_engine import EngineSettings
    from thrift_trainer.engine.work_queue import WorkQueue

log = logging.getLogger("coordinator.engine")

FIRST_UNIT_GRACE = 4.0  # deadline multiplier for a node that has not answered a unit yet
# The shortest deadline once a node's unit time is known: five heartbeats, since a unit's
# progress is seen through the 1 s pings, which a busy machine can hold up for seconds.
MEASURED_DEADLINE_FLOOR = 5.0
DEFAULT_BACKUP_FLOOR_SECONDS = 0.25
ADAPTIVE_BACKUP_MIN_SECONDS = 0.05
RECENT_UNITS = 64  # undelayed unit times the run's usual unit time is the median of


class BackupRule(Protocol):
    """What a scheduling policy says about backups (engine/policies.py)."""

    measured_backups: bool


def backup_threshold(typical_seconds: float | None, floor: float | None,
                     measured: bool = False) -> float:
    """Seconds a unit may be out before a backup attempt starts elsewhere.

    Four times the typical unit time, and at least `floor` (default 0.25 s). With
    ``measured`` (the adaptive policy), three times the measured unit time: a unit out
    much longer than units take is almost surely waiting in a load delay; until units
    have been measured, and never below an explicit floor, the base rule applies.
    """
    if measured and typical_seconds is not None and floor is None:
        return max(ADAPTIVE_BACKUP_MIN_SECONDS, 3 * typical_seconds)
    floor = DEFAULT_BACKUP_FLOOR_SECONDS if floor is None else floor
    return max(floor, 4 * (typical_seconds or 0.0))


def overdue_reason(node: NodeHandle, key: tuple[str, str, int], started: float, now: float,
                   deadline: float) -> str | None:
    """Why an attempt should be reclaimed now, or None. The deadline counts from the
    attempt's last sign of work: its start, its node saying it sits in its load delay,
    or its node reporting more batches done. A unit that progresses is never reclaimed,
    however busy its machine; one that stops progressing is, a deadline later."""
    if node.liveness.state(now) == "dead":
        return f"node {node.name} is dead (silent for {node.liveness.silent_seconds(now):.0f}s)"
    if node.stats.accepted == 0:
        # A node's first unit also loads libraries and builds caches (torch alone can
        # take many seconds on a busy machine): it gets more time.
        deadline *= FIRST_UNIT_GRACE
    name = "/".join(map(str, key))
    delaying = node.liveness.last_delaying(name)
    progressed = node.liveness.last_progress(name)
    idle = now - max(started, delaying or 0.0, progressed or 0.0)
    if idle > deadline:
        return f"deadline exceeded: no progress for {idle:.1f}s > {deadline:.1f}s"
    return None


class StragglerPolicy:
    """Deadlines, backup threshold and re-issue of one run's units (module docstring)."""

    def __init__(self, settings: EngineSettings, rule: BackupRule, run_id: str,
                 cancels: CancelSender) -> None:
        self.settings = settings
        self._measured_backups = rule.measured_backups
        self._run_id = run_id
        self._cancels = cancels
        self._recent: deque[float] = deque(maxlen=RECENT_UNITS)  # undelayed unit times
        self._lock = runtime.Lock()

    def note_unit_time(self, seconds: float) -> None:
        """An undelayed unit's compute time (the node's own, not the call's: queueing
        behind other units on a busy node must not raise the bar for a backup)."""
        with self._lock:
            self._recent.append(seconds)

    def typical(self) -> float | None:
        """The run's usual undelayed unit time, once one is measured."""
        with self._lock:
            recent = list(self._recent)
        return statistics.median(recent) if recent else None

    def backup_after(self) -> float | None:
        """The backup threshold now; None when backups are off."""
        if not self.settings.speculation:
            return None
        return backup_threshold(self.typical(), self.settings.speculate_after,
                                self._measured_backups)

    def deadline(self, node: NodeHandle | None = None) -> float:
        """Seconds a unit may go without progress (module docstring): a multiple of the
        node's own recent unit time (a node on a busy machine is slower; the deadline
        follows it), or of the run's usual unit time before the node has one."""
        s = self.settings
        own = node.unit_seconds() if node is not None else None
        if own is not None:
            floor = min(MEASURED_DEADLINE_FLOOR, s.deadline_floor)
            return min(s.deadline_cap, max(floor, s.deadline_factor * own))
        typical = self.typical() or 0.0
        return min(s.deadline_cap, max(s.deadline_floor, s.deadline_factor * typical))

    def reclaim(self, queue: WorkQueue) -> None:
        """Abort attempts past their deadline or on dead nodes: the worker sees a failure
        and the unit is issued again (a unit waiting in its load delay or reporting
        progress is working). The node is told to drop the attempt, so its maths stops
        instead of adding load while the unit runs again elsewhere."""
        now = runtime.monotonic()
        for unit, attempt, node, started in queue.live_attempts():
            key = (self._run_id, unit.spec.unit_id, attempt)
            reason = overdue_reason(node, key, started, now, self.deadline(node))
            if reason and node.abort(key, reason):
                log.warning("round %d: unit %s attempt %d on %s reclaimed: %s",
                            queue.round_index, unit.spec.unit_id, attempt, node.name, reason)
                self._cancels.send(node, self._run_id, unit.spec.unit_id, attempt)
