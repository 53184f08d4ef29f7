"""The coordinator's view of its compute nodes: connections, statistics and benching."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator.node_client import NodeClient
from coordinator.node_errors import NodeError
from coordinator.policies import NodeView
from coordinator.records import NodeSummary
from coordinator.tasks import Task, TaskResult, TaskStatus
from wire.stats import PayloadBytes

log = logging.getLogger("coordinator.nodes")

# A node that failed waits this long before it is tried again, doubling up to the cap.
BENCH_FIRST_SECONDS = 0.5
BENCH_MAX_SECONDS = 10.0
HEARTBEAT_SECONDS = 1.0  # how often the coordinator pings push nodes (pull nodes call in)
SUSPECT_SECONDS = 3.0  # silence that makes a node suspect ...
DEAD_SECONDS = 10.0  # ... and dead: its units are reclaimed
MAX_KEYS_KEPT = 4096  # attempts whose delay or progress a node's liveness remembers


@dataclass
class NodeStats:
    """Per-run counts users see in the summary."""

    accepted: int = 0
    rejected: int = 0
    delayed: int = 0
    failed: int = 0
    cancelled: int = 0
    busy_seconds: float = 0.0
    compute_seconds: float = 0.0
    delay_seconds: float = 0.0


class Liveness:
    """When a node was last heard from, the units it says are in their load delay, and
    when each unit's count of batches done last grew.

    alive: heard within `suspect` seconds; suspect: silent longer; dead: silent for
    `dead` seconds, and its units are reclaimed. Any answer counts: a heartbeat, a
    ping, a result."""

    def __init__(self, suspect: float = SUSPECT_SECONDS, dead: float = DEAD_SECONDS) -> None:
        self.suspect_after, self.dead_after = suspect, dead
        self._lock = threading.Lock()
        self._heard = time.monotonic()
        self.ever_heard = False  # until the node's first answer, `_heard` is its creation
        self._delaying: dict[str, float] = {}  # "run/unit/attempt" -> when last seen delaying
        self._progress: dict[str, tuple[int, float]] = {}  # key -> (batches, when it grew)

    def heard(self, delaying: list[str] | None = None,
              progress: dict[str, int] | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self._heard = now
            self.ever_heard = True
            for key in delaying or []:
                self._delaying[key] = now
            for key, batches in (progress or {}).items():
                before = self._progress.get(key)
                if batches > (before[0] if before else 0):
                    self._progress[key] = (batches, now)
            self._delaying = _newest(self._delaying, lambda t: t)
            self._progress = _newest(self._progress, lambda v: v[1])

    def silent_seconds(self, now: float | None = None) -> float:
        with self._lock:
            return max(0.0, (now or time.monotonic()) - self._heard)

    def state(self, now: float | None = None) -> str:
        silent = self.silent_seconds(now)
        if silent >= self.dead_after:
            return "dead"
        return "suspect" if silent >= self.suspect_after else "alive"

    def last_delaying(self, key: str) -> float | None:
        """When the node last said this attempt was in its load delay, if ever."""
        with self._lock:
            return self._delaying.get(key)

    def last_progress(self, key: str) -> float | None:
        """When the node last reported more batches done for this attempt, if ever."""
        with self._lock:
            seen = self._progress.get(key)
            return seen[1] if seen else None


def _newest(seen: dict[str, Any], when: Callable[[Any], float]) -> dict[str, Any]:
    """``seen`` cut to the newest half once it holds more than MAX_KEYS_KEPT keys."""
    if len(seen) <= MAX_KEYS_KEPT:
        return seen
    cutoff = sorted(when(v) for v in seen.values())[-MAX_KEYS_KEPT // 2]
    return {k: v for k, v in seen.items() if when(v) >= cutoff}


class NodeHandle:
    """One compute node as the engine sees it: its client (coordinator.node_client),
    counters, liveness, and the bench after failures."""

    def __init__(self, index: int, name: str, client: NodeClient) -> None:
        self.index = index
        self.name = name
        self.client = client
        self.address = client.address
        self.stats = NodeStats()
        self.in_flight = 0
        self.role: str | None = None  # from its pings: a relay, local workers (NodeInfo)
        self.members: list[NodeSummary] = []  # a relay's group, from its pings
        self.liveness = Liveness()
        self._lock = threading.Lock()
        self._compute_seconds: float | None = None  # moving averages for the policy
        self._delay_seconds: float | None = None
        self._benched_until = 0.0
        self._bench_seconds = 0.0

    @property
    def accepts_connections(self) -> bool:
        return self.client.accepts_connections

    @property
    def payload(self) -> PayloadBytes:
        """Bytes of this node's training calls, counted by its client."""
        return self.client.payload

    @payload.setter
    def payload(self, counter: PayloadBytes) -> None:
        self.client.payload = counter  # RunNodes shares one counter among a run's nodes

    # ------------------------------------------------------------------ calls
    def train(self, task: Task) -> TaskResult:
        """One training call; failures raise coordinator.node_errors (AttemptAborted with
        the reason for a call aborted from outside)."""
        result = self.client.train(task)
        self.liveness.heard()
        return result

    def abort(self, key: tuple[str, str, int], reason: str) -> bool:
        """Give up an attempt in progress (its call fails at once with `reason`)."""
        return self.client.abort(key, reason)

    def heartbeat(self) -> None:
        """Ping the node; an answer marks it alive and tells which units are delaying."""
        try:
            info = self.client.ping()
        except NodeError as exc:  # silence is what liveness measures
            log.debug("heartbeat to %s failed: %s", self.name, exc)
            return
        self.liveness.heard(info.delaying, info.progress)
        self.role, self.members = info.role, list(info.members)

    def refresh_group(self) -> None:
        """Ping a relay now, so its members' counts are current (a summary at a run's
        end, or a relay answering a ping for its own group); other nodes are left be."""
        if self.members:
            self.heartbeat()

    def can_be_told(self) -> bool:
        """Whether a cancel may reach the node now: a silent node would only make the
        sender wait out the control timeout."""
        return self.liveness.state() == "alive"

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        """Best effort: a node that cannot be told will time out the attempt anyway.
        Blocks up to the control timeout: callers send it through coordinator.cancels."""
        try:
            self.client.cancel(run_id, unit_id, attempt)
        except NodeError as exc:  # cancellation is advisory
            log.debug("could not cancel %s on %s: %s", unit_id, self.name, exc)

    def close(self) -> None:
        self.client.close()

    # -------------------------------------------------------------- bookkeeping
    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, result: TaskResult, seconds: float) -> None:
        """Record an answer (any outcome): the node is alive, so it leaves the bench."""
        with self._lock:
            self.in_flight -= 1
            self._bench_seconds = 0.0
            self.stats.busy_seconds += seconds
            self.stats.compute_seconds += result.compute_seconds
            self.stats.delay_seconds += result.delay_seconds
            status = result.status
            if status == TaskStatus.REJECTED:
                self.stats.rejected += 1
                return
            if result.delay_seconds > 0:
                self.stats.delayed += 1
                self._delay_seconds = _moving_average(self._delay_seconds,
                                                      result.delay_seconds)
            elif status == TaskStatus.COMPLETED:
                self._compute_seconds = _moving_average(self._compute_seconds,
                                                        result.compute_seconds)
            if status == TaskStatus.CANCELLED:
                self.stats.cancelled += 1
            else:
                self.stats.accepted += 1

    def failed(self, seconds: float, bench: bool) -> None:
        """Record a failed call; a node that did not answer is benched with growing back-off."""
        with self._lock:
            self.in_flight -= 1
            self.stats.failed += 1
            self.stats.busy_seconds += seconds
            if bench:
                self._bench_seconds = min(BENCH_MAX_SECONDS,
                                          max(BENCH_FIRST_SECONDS, self._bench_seconds * 2))
                self._benched_until = time.monotonic() + self._bench_seconds
        if bench:  # the node may have restarted: its idle connections are dead
            self.client.forget_connections()

    def unit_seconds(self) -> float | None:
        """This node's recent undelayed unit time (a moving average), once it has one."""
        with self._lock:
            return self._compute_seconds

    def benched_until(self) -> float:
        with self._lock:
            return self._benched_until

    def view(self, now: float) -> NodeView:
        with self._lock:
            return NodeView(
                index=self.index,
                in_flight=self.in_flight,
                admitted=self.stats.accepted + self.stats.cancelled,
                rejected=self.stats.rejected,
                delayed=self.stats.delayed,
                compute_seconds=self._compute_seconds,
                delay_seconds=self._delay_seconds,
                available=now >= self._benched_until,
            )

    def summary(self) -> NodeSummary:
        with self._lock:
            s = self.stats
            return NodeSummary(node=self.name, accepted=s.accepted, rejected=s.rejected,
                                      delayed=s.delayed, failed=s.failed, cancelled=s.cancelled,
                               busy_seconds=s.busy_seconds, compute_seconds=s.compute_seconds,
                               delay_seconds=s.delay_seconds, state=self.liveness.state(),
                               silent_seconds=self.liveness.silent_seconds(),
                               pull=not self.accepts_connections, role=self.role,
                               members=list(self.members))


def _moving_average(previous: float | None, value: float, weight: float = 0.3) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value
