"""Byte counters of the framed transport (wire.stats) against byte counts known exactly.

A real ComputeNode client and server on 127.0.0.1 exchange a call whose encoded size is
computed here from the Thrift binary format by hand, so the counters must match it to
the byte; a child process checks the TRAINER_WIRE_STATS file. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from thrift_trainer.wire import stats
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.rpc import ThriftServer, connect, transport_of
from thrift_trainer.wire.tensor_codec import to_wire

WAIT = 10.0
REPO = Path(__file__).resolve().parents[2]
PAYLOAD = np.arange(50_000, dtype=np.float32)  # 200,000 bytes


class Node(ComputeNode.Iface):
    """Answers ping only; the test sends a ping and a train call it rejects cheaply."""

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        return ttypes.NodeInfo(PROTOCOL_VERSION, "n", 0.0, 0, 0, 0, 1.0)

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        return ttypes.TrainResult(False, ttypes.UnitOutcome.REJECTED, [], 0, 0.0, 0.0, 0.0, 0.0)


@pytest.fixture
def server() -> Iterator[ThriftServer]:
    srv = ThriftServer(ComputeNode.Processor(Node()), "127.0.0.1", 0)
    thread = srv.serve_in_thread()
    yield srv
    srv.stop()
    thread.join(WAIT)


def _string(text: str) -> int:
    return 4 + len(text.encode())


def ping_call_bytes() -> int:
    """Frame header + message begin + args struct {1: PingRequest {1: i32}}."""
    message_begin = 4 + _string("ping") + 4
    request = (1 + 2 + 4) + 1  # field header + i32, stop
    args = (1 + 2) + request + 1
    return 4 + message_begin + args


def work_call_bytes(request: ttypes.WorkRequest) -> int:
    """The WorkRequest's encoded size, computed field by field from the binary format."""
    header = 1 + 2
    tensor = request.weights[0]
    tensor_bytes = (header + _string(tensor.name)) + (header + _string(tensor.dtype)) \
        + (header + 1 + 4 + 8 * len(tensor.shape)) + (header + 4 + len(tensor.data)) + 1
    fields = (header + 4) + (header + _string(request.run_id)) + (header + 8) \
        + (header + _string(request.unit_id)) + (header + 4) \
        + (header + _string(request.algorithm)) + (header + _string(request.model)) \
        + (header + _string(request.dataset)) + (header + _string(request.unit_path)) \
        + (header + _string(request.config_json)) + (header + 1 + 4 + tensor_bytes) \
        + (header + 4) + 1
    args = header + fields + 1
    return 4 + (4 + _string("train_with_weights") + 4) + args


def test_message_label_reads_method_and_kind() -> None:
    message = bytes.fromhex("80010001") + (4).to_bytes(4, "big") + b"ping" + bytes(4)
    assert stats.message_label(message) == "ping call"
    assert stats.message_label(bytes.fromhex("80010002") + message[4:]) == "ping reply"
    assert stats.message_label(b"\x00\x00\x00\x04ping") == "?"  # not a strict message
    assert stats.message_label(b"\x80\x01") == "?"


def test_counters_match_the_encoded_sizes_exactly(server: ThriftServer) -> None:
    stats.WIRE_STATS.reset()
    request = ttypes.WorkRequest(PROTOCOL_VERSION, "run", 1, "u1", 1, "sync_sgd", "dcgan28",
                                 "mnist", "images", "{}", [to_wire("w", PAYLOAD)], 2)
    with connect(ComputeNode.Client, "127.0.0.1", server.port, read_timeout=WAIT) as client:
        client.ping(ttypes.PingRequest(PROTOCOL_VERSION))
        client.train_with_weights(request)
        transport = transport_of(client)
        sent, received = transport.bytes_sent, transport.bytes_received
    expected_sent = ping_call_bytes() + work_call_bytes(request)
    assert sent == expected_sent
    assert transport.frames_sent == transport.frames_received == 2
    snapshot = _settled_snapshot(frames=8)
    by_method = snapshot["by_method"]
    # The server's side of the same connection lives in this process too.
    assert by_method["ping call"]["sent_bytes"] == ping_call_bytes()
    assert by_method["ping call"]["received_bytes"] == ping_call_bytes()
    assert by_method["train_with_weights call"]["sent_bytes"] == work_call_bytes(request)
    assert by_method["train_with_weights reply"]["received_bytes"] \
        == by_method["train_with_weights reply"]["sent_bytes"]
    replies = by_method["ping reply"]["received_bytes"] \
        + by_method["train_with_weights reply"]["received_bytes"]
    assert received == replies
    assert snapshot["totals"]["sent_bytes"] == snapshot["totals"]["received_bytes"] \
        == expected_sent + replies
    assert snapshot["by_peer"][f"127.0.0.1:{server.port}"]["sent_bytes"] == expected_sent


def _settled_snapshot(frames: int) -> dict:
    """The registry once it holds `frames` frames: a server counts its reply after sending
    it, so the client may read the reply a moment before the server has counted it."""
    assert stats.WIRE_STATS.wait_for_frames(frames, WAIT), "frames were not counted in time"
    return stats.WIRE_STATS.snapshot()


def test_counting_is_thread_safe() -> None:
    registry = stats.WireStats()
    message = bytes.fromhex("80010001") + (1).to_bytes(4, "big") + b"x" + bytes(4)

    def hammer() -> None:
        for _ in range(2_000):
            registry.record(stats.SENT, "p", 10, message)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert registry.snapshot()["by_method"]["x call"] == {
        "sent_bytes": 80_000, "sent_frames": 8_000, "received_bytes": 0, "received_frames": 0}


def test_environment_variable_writes_a_file_per_process(tmp_path: Path) -> None:
    script = (
        "import socket\n"
        "from wire.transport import FramedSocketTransport\n"
        "a, b = socket.socketpair()\n"
        "ta, tb = FramedSocketTransport(a, peer='b'), FramedSocketTransport(b, peer='a')\n"
        "ta.write(bytes(100)); ta.flush(); tb.readAll(100)\n"
    )
    env = {**os.environ, stats.ENV_PATH: str(tmp_path / "wire-{pid}.json"),
           stats.ENV_EVERY: "0.05"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    files = list(tmp_path.glob("wire-*.json"))
    assert [f.name for f in files] == [f"wire-{json.loads(files[0].read_text())['pid']}.json"]
    totals = json.loads(files[0].read_text())["totals"]
    assert totals == {"sent_bytes": 104, "sent_frames": 1, "received_bytes": 104,
                      "received_frames": 1}


def test_writers_at_once_leave_one_whole_snapshot(tmp_path: Path) -> None:
    # The periodic writer and the exit handler of a process may write at the same moment.
    path, counts, damaged = str(tmp_path / "wire.json"), stats.WireStats(), []

    def write() -> None:
        for _ in range(200):
            stats.write_snapshot(path, counts)
            try:
                json.loads(Path(path).read_text())
            except ValueError as exc:
                damaged.append(exc)

    writers = [threading.Thread(target=write) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(WAIT)
    assert not damaged
