"""Whether each node lives: the one place that decides alive, suspect and dead.

Every answer of a node counts as a sign of life: a heartbeat (`HeartbeatMonitor` pings
pushed nodes every second or so; pull nodes call in with their own heartbeats, see
engine/nodes/membership.py), a ping, a result. `Liveness` keeps when a node was last heard
from, which of its units sit in their load delay and when each unit's count of batches
last grew. Silence makes a node suspect, then dead, and the round engine reclaims a dead
node's units (engine/stragglers.py's `overdue_reason`). Whether a run has enough live
nodes to go on is engine/nodes/quorum.py; which nodes belong to a run,
engine/nodes/run_nodes.py.

Pings run on a few threads, one at a time per node, so a node that stopped answering (a
frozen process keeps its socket open) cannot hold up the others' heartbeats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from thrift_trainer.engine import runtime

HEARTBEAT_SECONDS = 1.0  # how often the coordinator pings push nodes (pull nodes call in)
SUSPECT_SECONDS = 3.0  # silence that makes a node suspect ...
DEAD_SECONDS = 10.0  # ... and dead: its units are reclaimed
MAX_KEYS_KEPT = 4096  # attempts whose delay or progress a node's liveness remembers
PING_THREADS = 8


class Liveness:
    """When a node was last heard from, the units it says are in their load delay, and
    when each unit's count of batches done last grew.

    alive: heard within `suspect` seconds; suspect: silent longer; dead: silent for
    `dead` seconds, and its units are reclaimed. Any answer counts: a heartbeat, a
    ping, a result."""

    def __init__(self, suspect: float = SUSPECT_SECONDS, dead: float = DEAD_SECONDS) -> None:
        self.suspect_after, self.dead_after = suspect, dead
        self._lock = runtime.Lock()
        self._heard = runtime.monotonic()
        self.ever_heard = False  # until the node's first answer, `_heard` is its creation
        self._delaying: dict[str, float] = {}  # "run/unit/attempt" -> when last seen delaying
        self._progress: dict[str, tuple[int, float]] = {}  # key -> (batches, when it grew)

    def heard(self, delaying: list[str] | None = None,
              progress: dict[str, int] | None = None) -> None:
        now = runtime.monotonic()
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
            return max(0.0, (now or runtime.monotonic()) - self._heard)

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


class Pingable(Protocol):
    """What the heartbeats need of a node (engine/nodes/pool.py's NodeHandle is one)."""

    name: str
    liveness: Liveness

    @property
    def accepts_connections(self) -> bool: ...

    def heartbeat(self) -> None: ...


class HeartbeatMonitor:
    """Pings `nodes()` every `interval` seconds until `stop()`."""

    def __init__(self, nodes: Callable[[], Sequence[Pingable]],
                 interval: float = HEARTBEAT_SECONDS,
                 record: Callable[[dict[str, float]], None] | None = None) -> None:
        """`record` gets, once per interval, the nodes heard from since the last time,
        with when (UNIX seconds): the run store's last heartbeat of each node."""
        self._nodes = nodes
        self._interval = interval
        self._record = record
        self._recorded: dict[str, float] = {}
        self._stopped = runtime.Event()
        self._ended = runtime.Event()
        self._in_flight: dict[str, runtime.Task] = {}

    def start(self) -> HeartbeatMonitor:
        runtime.start_thread(self._loop, "heartbeats")
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._ended.wait(self._interval + 1.0)

    def _loop(self) -> None:
        try:
            while not self._stopped.wait(self._interval):
                nodes = self._nodes()
                for node in nodes:
                    if not node.accepts_connections:
                        continue  # pull nodes heartbeat in
                    previous = self._in_flight.get(node.name)
                    if previous is None or previous.done():  # one ping a node at a time
                        self._in_flight[node.name] = runtime.submit(
                            node.heartbeat, name=f"heartbeat-{node.name}")
                self._record_heard(nodes)
        finally:
            self._ended.set()

    def _record_heard(self, nodes: Sequence[Pingable]) -> None:
        if self._record is None:
            return
        now = runtime.wall()
        heard = {}
        for node in nodes:
            when = round(now - node.liveness.silent_seconds(), 3)
            if when > self._recorded.get(node.name, 0.0) + self._interval / 2:
                heard[node.name] = self._recorded[node.name] = when
        if heard:
            self._record(heard)
