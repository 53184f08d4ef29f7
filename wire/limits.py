"""What one server grants its peers: connections, waiting time and memory for frames.

A `ThriftServer` holds one `ServerLimits` (default: the process's, from the command's
flags via `wire.security`) and builds from it:

* `ConnectionSlots`: at most `max_connections` open connections, and at most
  `max_connections_per_peer` from one address, so a peer opening hundreds of
  connections cannot take every thread and file descriptor;
* `FrameBudget`: the bytes that frames still arriving from peers not yet
  authenticated may claim together, so trickled frames cannot pin memory, and the share
  of them one address may claim, so peers at one address cannot take all the room;
* `RefusalLog`: refusals are counted and logged at most once per interval,
  so a flood of refused connections does not flood the log.

`idle_timeout` bounds the wait for a request to start and `frame_timeout` the time
from a frame's first byte to its last (`wire.transport.ServerReads` applies both).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_IDLE_SECONDS = 120.0
DEFAULT_FRAME_SECONDS = 120.0
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_MAX_CONNECTIONS_PER_PEER = 128
DEFAULT_PENDING_FRAME_BYTES = 1024 * MIB
REFUSAL_LOG_SECONDS = 60.0


@dataclass(frozen=True)
class ServerLimits:
    """Per-server limits; docs/deployment.md names their flags.

    idle_timeout: longest wait for the next request on an open connection (None: forever).
    frame_timeout: longest time from the first byte of a frame to its last.
    max_connections / max_connections_per_peer: open connections, in all / per address.
    pending_frame_bytes: bytes that unfinished frames of unauthenticated peers may claim
        (one address at most its largest frame's worth: see ThriftServer).
    """

    idle_timeout: float | None = DEFAULT_IDLE_SECONDS
    frame_timeout: float = DEFAULT_FRAME_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    pending_frame_bytes: int = DEFAULT_PENDING_FRAME_BYTES

    def describe(self) -> str:
        """One line for the start-up log."""
        idle = "off" if self.idle_timeout is None else f"{self.idle_timeout:g}s"
        return (f"idle timeout {idle}, frame timeout {self.frame_timeout:g}s, "
                f"at most {self.max_connections} connections "
                f"({self.max_connections_per_peer} per peer), "
                f"{self.pending_frame_bytes / MIB:g} MiB for unfinished frames")


class ConnectionSlots:
    """Counts open connections in all and per peer address; thread-safe."""

    def __init__(self, total: int, per_peer: int) -> None:
        self._total, self._per_peer = total, per_peer
        self._open: Counter[str] = Counter()
        self._count = 0
        self._lock = threading.Lock()

    def acquire(self, peer_host: str) -> str | None:
        """Take a slot for a connection from `peer_host`; None if granted, else why not."""
        with self._lock:
            if self._count >= self._total:
                return f"the server holds its limit of {self._total} connections"
            if self._open[peer_host] >= self._per_peer:
                return f"{peer_host} holds its limit of {self._per_peer} connections"
            self._open[peer_host] += 1
            self._count += 1
            return None

    def release(self, peer_host: str) -> None:
        with self._lock:
            self._count -= 1
            self._open[peer_host] -= 1
            if self._open[peer_host] <= 0:
                del self._open[peer_host]


class FrameBudget:
    """Bytes that unfinished frames may claim together, at most `per_peer` of them from
    one address; a claim waits until it fits.

    A frame claims its whole declared size before its body is read (the memory itself
    is only committed as bytes arrive) and gives it back once complete or abandoned.
    Whole claims, never partial ones, so two big frames cannot each hold half and wait
    on each other. The share per address means that peers announcing big frames and
    sending nothing hold at most `per_peer` bytes, and callers at other addresses are
    still served from the rest.
    """

    def __init__(self, capacity: int, per_peer: int | None = None) -> None:
        self.capacity = capacity
        self.per_peer = min(per_peer or capacity, capacity)
        self._claimed = 0
        self._by_peer: Counter[str] = Counter()
        self._waiting = 0
        self._freed = threading.Condition()

    def claim(self, nbytes: int, deadline: float, peer_host: str = "") -> bool:
        """Claim `nbytes` (at most the per-peer share) for a frame from `peer_host` by the
        monotonic `deadline`; False if not."""
        nbytes = min(nbytes, self.per_peer)
        with self._freed:
            self._waiting += 1
            try:
                while (self._claimed + nbytes > self.capacity
                       or self._by_peer[peer_host] + nbytes > self.per_peer):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._freed.wait(left)
            finally:
                self._waiting -= 1
            self._claimed += nbytes
            self._by_peer[peer_host] += nbytes
            return True

    def release(self, nbytes: int, peer_host: str = "") -> None:
        nbytes = min(nbytes, self.per_peer)
        with self._freed:
            self._claimed -= nbytes
            self._by_peer[peer_host] -= nbytes
            if self._by_peer[peer_host] <= 0:
                del self._by_peer[peer_host]
            self._freed.notify_all()

    @property
    def claimed(self) -> int:
        with self._freed:
            return self._claimed

    @property
    def waiting(self) -> int:
        """Claims waiting for room."""
        with self._freed:
            return self._waiting


class RefusalLog:
    """Logs refused connections at most once per `interval` seconds, with their count."""

    def __init__(self, port: int, interval: float = REFUSAL_LOG_SECONDS) -> None:
        self._port, self._interval = port, interval
        self._lock = threading.Lock()
        self._unlogged = 0
        self._next_log = 0.0

    def refused(self, why: str) -> None:
        """Count one refusal; log it (with those not yet logged) unless logged lately."""
        now = time.monotonic()
        with self._lock:
            self._unlogged += 1
            if now < self._next_log:
                return
            count, self._unlogged = self._unlogged, 0
            self._next_log = now + self._interval
        log.warning("port %d refused %d connection(s) since its last report (at most one a "
                    "%gs), the latest because %s", self._port, count, self._interval, why)
