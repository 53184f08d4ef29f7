"""Heartbeats of push nodes: the coordinator pings each node every second or so.

An answer marks the node alive and says which of its units sit in their load delay;
silence makes it suspect, then dead (see node_pool.Liveness), and the round engine
reclaims a dead node's units. Pings run on a few threads, one at a time per node, so
a node that stopped answering (a frozen process keeps its socket open) cannot hold up
the others' heartbeats.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from coordinator.node_pool import HEARTBEAT_SECONDS, NodeHandle

PING_THREADS = 8


class HeartbeatMonitor:
    """Pings `nodes()` every `interval` seconds until `stop()`."""

    def __init__(self, nodes: Callable[[], list[NodeHandle]],
                 interval: float = HEARTBEAT_SECONDS,
                 record: Callable[[dict[str, float]], None] | None = None) -> None:
        """`record` gets, once per interval, the nodes heard from since the last time,
        with when (UNIX seconds): the run store's last heartbeat of each node."""
        self._nodes = nodes
        self._interval = interval
        self._record = record
        self._recorded: dict[str, float] = {}
        self._stopped = threading.Event()
        self._pool = ThreadPoolExecutor(PING_THREADS, thread_name_prefix="heartbeat")
        self._in_flight: dict[str, Future] = {}
        self._thread = threading.Thread(target=self._loop, name="heartbeats", daemon=True)

    def start(self) -> HeartbeatMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=self._interval + 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            nodes = self._nodes()
            for node in nodes:
                if not node.accepts_connections:
                    continue  # pull nodes heartbeat in
                previous = self._in_flight.get(node.name)
                if previous is None or previous.done():
                    self._in_flight[node.name] = self._pool.submit(node.heartbeat)
            self._record_heard(nodes)

    def _record_heard(self, nodes: list[NodeHandle]) -> None:
        if self._record is None:
            return
        now = time.time()
        heard = {}
        for node in nodes:
            when = round(now - node.liveness.silent_seconds(), 3)
            if when > self._recorded.get(node.name, 0.0) + self._interval / 2:
                heard[node.name] = self._recorded[node.name] = when
        if heard:
            self._record(heard)
