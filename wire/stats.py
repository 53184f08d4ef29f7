"""Bytes on the wire, counted where they are sent and received: the framed transport.

Every `wire.transport.FramedSocketTransport` counts its own frames and bytes
(`bytes_sent`, `bytes_received`, `frames_sent`, `frames_received`) and reports each frame
to the process-wide registry `WIRE_STATS`, which keeps totals by Thrift method and message
type (e.g. ``train_with_weights call``) and by peer (``host:port`` as the transport names
it). A frame counts its 4-byte length header and the whole Thrift message; TCP/IP headers
are not counted. Counting costs a lock and a few bytes of parsing per frame, nothing per
byte: a 16 MiB tensor costs the same to count as a ping.

Reading the counters:

* in process: ``WIRE_STATS.snapshot()`` (JSON-ready dict), ``WIRE_STATS.reset()``;
* from outside, for any process that uses `wire/` (node, coordinator, client) without
  touching its command line: set ``TRAINER_WIRE_STATS=PATH`` in its environment and it
  writes the snapshot as JSON to PATH every ``TRAINER_WIRE_STATS_EVERY`` seconds
  (default 1) and once more at a normal exit. ``{pid}`` in PATH is replaced by the process
  id, so one setting serves several processes. A process killed abruptly leaves its last
  periodic snapshot. Per-iteration figures come from dividing the counts of the methods an
  algorithm uses per iteration by the iterations run (see ``bench/mdgan_paper.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import struct
import threading
import time
from typing import Any

from thrift.transport.TTransport import TTransportBase

ENV_PATH = "TRAINER_WIRE_STATS"
ENV_EVERY = "TRAINER_WIRE_STATS_EVERY"
SENT, RECEIVED = "sent", "received"
# Connections accepted by a server are named by the client's ephemeral port, so a
# long-lived server could see unboundedly many peers; beyond this they are pooled.
MAX_PEERS = 256
OTHER_PEERS = "<other peers>"
MAX_NAME_BYTES = 128
_STRICT_VERSION = 0x80010000
_VERSION_MASK = 0xFFFF0000
_KINDS = {1: "call", 2: "reply", 3: "exception", 4: "oneway"}
_U32 = struct.Struct("!I")


def message_label(message: bytes | bytearray | memoryview) -> str:
    """``"<method> <call|reply|exception|oneway>"`` from the start of a strict binary
    Thrift message (what `WireProtocol` writes), or ``"?"`` when it is not one."""
    if len(message) < 8:
        return "?"
    version, length = _U32.unpack_from(message, 0)[0], _U32.unpack_from(message, 4)[0]
    if version & _VERSION_MASK != _STRICT_VERSION:
        return "?"
    if not 0 < length <= MAX_NAME_BYTES or len(message) < 8 + length:
        return "?"
    name = bytes(message[8:8 + length]).decode("ascii", errors="replace")
    return f"{name} {_KINDS.get(version & 0xFF, 'unknown')}"


def _empty_counts() -> dict[str, int]:
    return {"sent_bytes": 0, "sent_frames": 0, "received_bytes": 0, "received_frames": 0}


class WireStats:
    """Thread-safe byte and frame counts of one process, by message label and by peer."""

    def __init__(self) -> None:
        self._lock = threading.Condition()  # notified on every frame, for wait_for_frames
        self._frames = 0
        self._started = time.time()
        self._by_label: dict[str, dict[str, int]] = {}
        self._by_peer: dict[str, dict[str, int]] = {}

    def record(self, direction: str, peer: str, nbytes: int,
               message: bytes | bytearray | memoryview, frames: int = 1) -> None:
        """Count ``frames`` frames of ``nbytes`` in all (headers included) whose message
        starts ``message`` (a chunked message is several); ``direction`` is `SENT` or
        `RECEIVED`."""
        label = message_label(message)
        with self._lock:
            for table, key in ((self._by_label, label), (self._by_peer, peer)):
                counts = table.get(key)
                if counts is None:
                    if table is self._by_peer and len(table) >= MAX_PEERS:
                        key = OTHER_PEERS
                    counts = table.setdefault(key, _empty_counts())
                counts[direction + "_bytes"] += nbytes
                counts[direction + "_frames"] += frames
            self._frames += frames
            self._lock.notify_all()

    def wait_for_frames(self, frames: int, timeout: float) -> bool:
        """Wait until `frames` frames (sent and received) have been counted; False if
        `timeout` seconds pass first. A server counts its reply after sending it, so a
        reader of the counts may have to wait for it."""
        with self._lock:
            return self._lock.wait_for(lambda: self._frames >= frames, timeout)

    def reset(self) -> None:
        """Forget every count (e.g. between the runs of one process)."""
        with self._lock:
            self._started = time.time()
            self._frames = 0
            self._by_label.clear()
            self._by_peer.clear()

    def snapshot(self) -> dict[str, Any]:
        """Totals, counts by message label and by peer, as plain JSON-ready dicts."""
        with self._lock:
            by_label = {k: dict(v) for k, v in sorted(self._by_label.items())}
            by_peer = {k: dict(v) for k, v in sorted(self._by_peer.items())}
            started = self._started
        totals = _empty_counts()
        for counts in by_label.values():
            for key, value in counts.items():
                totals[key] += value
        return {"pid": os.getpid(), "since": started, "time": time.time(), "totals": totals,
                "by_method": by_label, "by_peer": by_peer}


WIRE_STATS = WireStats()


_WRITING = threading.Lock()  # the periodic writer and the exit handler share a temp file


def write_snapshot(path: str, stats: WireStats = WIRE_STATS) -> None:
    """Write the snapshot atomically (a reader never sees half a file), one writer at a
    time: two writers of one temp file could leave two snapshots run together in it."""
    tmp = f"{path}.tmp"
    with _WRITING:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(stats.snapshot(), f)
        os.replace(tmp, path)


def dump_from_environment(environ: dict[str, str] | None = None) -> str | None:
    """Start writing snapshots if ``TRAINER_WIRE_STATS`` is set; returns the path or None.

    A daemon thread writes every ``TRAINER_WIRE_STATS_EVERY`` seconds and an exit handler
    writes the final counts. Called once when `wire.transport` is imported.
    """
    env = os.environ if environ is None else environ
    template = env.get(ENV_PATH)
    if not template:
        return None
    path = template.replace("{pid}", str(os.getpid()))
    every = float(env.get(ENV_EVERY, "1"))
    if not every > 0:
        raise ValueError(f"{ENV_EVERY} must be a positive number of seconds, got {every}")
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):  # ends with the process (daemon) or at exit
            _write_quietly(path)

    def final() -> None:
        stop.set()
        _write_quietly(path)

    threading.Thread(target=loop, name="wire-stats", daemon=True).start()
    atexit.register(final)
    return path


def _write_quietly(path: str) -> None:
    """Statistics must never take a node down: a failed write is skipped."""
    with contextlib.suppress(OSError):
        write_snapshot(path)


class _CountingTransport(TTransportBase):
    """Counts what is written to it and keeps nothing."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, buf: bytes | bytearray | memoryview) -> None:
        self.size += memoryview(buf).nbytes


def encoded_size(struct_: Any) -> int:
    """Bytes of a Thrift struct in the binary protocol, counted without encoding it (a
    unit's weights are not copied to learn their size)."""
    from thrift_trainer.wire.transport import WireProtocol  # which imports this module

    counter = _CountingTransport()
    struct_.write(WireProtocol(counter))
    return counter.size


class PayloadBytes:
    """Bytes of one run's training calls, thread-safe: ``down`` the work requests (weights)
    sent to nodes, ``up`` the results (updates) received. Push nodes count the frames of
    each call at its connection's transport; pull nodes the encoded request and result
    that their lease and submission carry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down = 0
        self.up = 0

    def add(self, down: int, up: int) -> None:
        with self._lock:
            self.down += down
            self.up += up

    def totals(self) -> tuple[int, int]:
        """(down, up) so far."""
        with self._lock:
            return self.down, self.up
