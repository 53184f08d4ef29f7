"""Heartbeats of push nodes: the coordinator pings each node every second or so.

An answer marks the node alive and says which of its units sit in their load delay;
silence makes it suspect, then dead (see node_pool.Liveness), and the round engine
reclaims a dead node's units. Pings run on a few threads, one at a time per node, so
a node that stopped answering (a frozen process keeps its socket open) cannot hold up
the others' heartbeats.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from coordinator.node_pool import HEARTBEAT_SECONDS, NodeHandle

PING_THREADS = 8


class HeartbeatMonitor:
    """Pings `nodes()` every `interval` seconds until `stop()`."""

    def __init__(self, nodes: Callable[[], list[NodeHandle]],
                 interval: float = HEARTBEAT_SECONDS) -> None:
        self._nodes = nodes
        self._interval = interval
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
            for node in self._nodes():
                if not node.accepts_connections:
                    continue  # pull nodes heartbeat in
                previous = self._in_flight.get(node.name)
                if previous is None or previous.done():
                    self._in_flight[node.name] = self._pool.submit(node.heartbeat)
