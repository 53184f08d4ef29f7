"""Hostile bytes at a compute node and a coordinator, each in its own process.

A seeded fuzzer sends a few hundred cases to each server: random bytes, truncated
frames, frames declaring huge lengths, messages declaring huge strings and
containers, valid frames with garbage inside, and valid requests with bytes
flipped. Each case has its own connection, half-closed once sent, and the
server must hang up within CASE_SECONDS. Afterwards both servers still answer
`ping` and their resident memory has grown by less than RSS_GROWTH_LIMIT.

The servers require a token and the fuzzed requests that could do work carry
none, so a mutation cannot start a training run; what is fuzzed is the scan of
the raw request for its token, and the decoding of those that carry it.

A second test plays hostile peers at both servers, started with short
--idle-timeout and --frame-timeout and a small --max-connections-per-peer:
silent connections, more connections than allowed, a frame trickling in, a
token-less request of a million tiny elements and a request with fields a newer
peer might add. The servers must cut them off in time, refuse the extra
connections with a single log line, stay within RSS_GROWTH_LIMIT and keep serving.
"""

from __future__ import annotations

import random
import re
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from devtools.local_cluster import Proc
from tests.conftest import Cluster
from tests.hostile import hangs_up_within, resident_bytes
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect
from thrift_trainer.wire.tensor_codec import dict_to_wire

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

SEED = 20240521
CASES_PER_SERVER = 300
CASE_SECONDS = 5.0  # each case: the server must hang up within this
FUZZ_SECONDS = 120.0  # all cases of one server
MAX_FRAME_MB = 64
RSS_GROWTH_LIMIT = 100 * 1024 * 1024
TOKEN = "fuzz-token"
HOST = "127.0.0.1"
VERSION_CALL = TBinaryProtocol.VERSION_1 | TMessageType.CALL


# ---------------------------------------------------------------- encoding
def message(method: str, args: Any, seqid: int = 1) -> bytes:
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, TMessageType.CALL, seqid)
    args.write(protocol)
    protocol.writeMessageEnd()
    return buffer.getvalue()


def framed(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def call_header(method: str) -> bytes:
    """A message header and the start of argument 1 (the request struct)."""
    name = method.encode()
    return (struct.pack("!iI", VERSION_CALL, len(name)) + name + struct.pack("!i", 7)
            + struct.pack("!bh", TType.STRUCT, 1))


def work_request(token: str | None = None) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="fuzz", round=0, unit_id="u", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="train_1.txt",
        config_json="{}", weights=dict_to_wire({"w": [[1.0, 2.0], [3.0, 4.0]], "b": [0.5]}),
        scheduling_policy=2, token=token)


def node_requests() -> list[bytes]:
    """Valid calls of the ComputeNode; those that could do work carry no token."""
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token=TOKEN)
    cancel = ttypes.CancelUnitRequest(run_id="fuzz", unit_id="u", token=TOKEN)
    return [message("ping", ComputeNode.ping_args(request=ping)),
            message("cancel_unit", ComputeNode.cancel_unit_args(request=cancel)),
            message("train_with_weights", ComputeNode.train_with_weights_args(
                request=work_request()))]


def coordinator_requests() -> list[bytes]:
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token=TOKEN)
    status = ttypes.StatusRequest(run_id="nope", token=TOKEN)
    runs = ttypes.ListRunsRequest(limit=3, token=TOKEN)
    train = ttypes.TrainRequest(protocol_version=PROTOCOL_VERSION, run_id="fuzz",
                                algorithm="delta_avg", model="mlp", dataset="letters",
                                rounds=1, config_json="{}")
    submit = ttypes.SubmitRequest(
        protocol_version=PROTOCOL_VERSION, node="n", run_id="fuzz", unit_id="u", attempt=1,
        result=ttypes.TrainResult(True, ttypes.UnitOutcome.COMPLETED, work_request().weights,
                                  4, 0.1, 0.2, 0.0, 0.0))
    return [message("ping", Coordinator.ping_args(request=ping)),
            message("status", Coordinator.status_args(request=status)),
            message("list_runs", Coordinator.list_runs_args(request=runs)),
            message("train", Coordinator.train_args(request=train)),
            message("submit_result", Coordinator.submit_result_args(request=submit))]


# ------------------------------------------------------------------- cases
Case = Callable[[random.Random, list[bytes], list[str]], bytes]


def random_bytes(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    return rng.randbytes(rng.randint(0, 4096))


def truncated_frame(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    whole = framed(rng.choice(valid))
    return whole[: rng.randint(1, len(whole) - 1)]


def huge_frame_length(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    limit = MAX_FRAME_MB * 1024 * 1024
    declared = rng.choice([2**31 - 1, limit + 1, limit, limit - 1, 10 * 1024 * 1024, -1, -2**31])
    return struct.pack("!i", declared) + rng.randbytes(rng.randint(0, 2048))


def huge_string_length(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    length = rng.choice([2**31 - 1, 2**30, MAX_FRAME_MB * 1024 * 1024, 100_000, -1])
    if rng.random() < 0.5:  # the method name itself
        body = struct.pack("!ii", VERSION_CALL, length) + b"ping"
    else:  # a string field of the request
        body = (call_header(rng.choice(methods)) + struct.pack("!bhi", TType.STRING, 2, length)
                + b"abc")
    return framed(body)


def huge_container_length(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    size = rng.choice([2**31 - 1, 1_000_001, 999_999, 65_536, -1])
    kind = rng.choice([TType.LIST, TType.SET, TType.MAP])
    if kind == TType.MAP:
        header = struct.pack("!bbi", TType.STRING, TType.DOUBLE, size)
    else:
        header = struct.pack("!bi", rng.choice([TType.STRUCT, TType.I64, TType.STRING]), size)
    field = rng.choice([11, 3, 2, 42])  # weights, shape-like, a string field, unknown
    body = call_header(rng.choice(methods)) + struct.pack("!bh", kind, field) + header
    return framed(body + rng.randbytes(rng.randint(0, 64)))


def garbage_in_a_frame(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    body = call_header(rng.choice(methods)) if rng.random() < 0.7 else b""
    return framed(body + rng.randbytes(rng.randint(0, 2048)))


def flipped_bytes(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    body = bytearray(rng.choice(valid))
    for _ in range(rng.randint(1, 8)):
        body[rng.randrange(len(body))] = rng.randrange(256)
    return framed(bytes(body))


def valid_then_garbage(rng: random.Random, valid: list[bytes], methods: list[str]) -> bytes:
    return framed(rng.choice(valid)) + rng.randbytes(rng.randint(1, 256))


CASES: list[Case] = [random_bytes, truncated_frame, huge_frame_length, huge_string_length,
                     huge_container_length, garbage_in_a_frame, flipped_bytes, valid_then_garbage]


# -------------------------------------------------------------- the fuzzer
def deliver(port: int, payload: bytes) -> bool:
    """Send `payload`, half-close, read until the server hangs up: False if it did not."""
    with socket.create_connection((HOST, port), timeout=CASE_SECONDS) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except TimeoutError:
            return False
        except OSError:  # reset, broken pipe, not connected: it hung up before we finished
            return True
        for _ in range(1000):  # replies are small; a server hanging up ends the loop
            try:
                if not sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False
    return False


def fuzz(port: int, rng: random.Random, valid: list[bytes], methods: list[str]) -> list[str]:
    """Run the cases; the names of those the server did not hang up on in time."""
    deadline = time.monotonic() + FUZZ_SECONDS
    stuck = []
    for index in range(CASES_PER_SERVER):
        assert time.monotonic() < deadline, f"fuzzing took over {FUZZ_SECONDS}s ({index} cases)"
        case = CASES[index % len(CASES)]
        if not deliver(port, case(rng, valid, methods)):
            stuck.append(f"{index}:{case.__name__}")
    return stuck


def ping(service: Any, proc: Proc) -> ttypes.NodeInfo:
    with connect(service.Client, HOST, proc.port, token=TOKEN, read_timeout=CASE_SECONDS) as c:
        return c.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION))


def test_fuzzed_frames_leave_both_servers_serving_with_bounded_memory(
    cluster: Cluster, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags = ["--token-file", str(token_file), "--max-frame-mb", str(MAX_FRAME_MB)]
    node = cluster.add_node(0.0, *flags)
    coordinator = cluster.start_coordinator(2, *flags)
    targets = [(ComputeNode, node, node_requests()), (Coordinator, coordinator,
                                                       coordinator_requests())]
    rng = random.Random(SEED)
    for service, proc, valid in targets:
        ping(service, proc)  # warmed up: the first call's imports are not counted
        before = resident_bytes(proc)
        methods = sorted(service.Processor(None)._processMap)
        stuck = fuzz(proc.port, rng, valid, methods)
        assert stuck == [], f"{service.__name__} did not hang up on: {stuck}\n{cluster.logs()}"
        assert proc.alive(), cluster.logs()
        assert ping(service, proc).protocol_version == PROTOCOL_VERSION
        grown = resident_bytes(proc) - before
        assert grown < RSS_GROWTH_LIMIT, f"{service.__name__} grew by {grown / 2**20:.0f} MiB"


def test_a_frame_over_max_frame_mb_is_refused_with_an_error_in_the_log(cluster: Cluster) -> None:
    node = cluster.add_node(0.0, "--max-frame-mb", "1")
    assert deliver(node.port, struct.pack("!i", 2 * 1024 * 1024) + b"x" * 1024)
    node.wait_for(r"ERROR closing .*frame of 2097152 bytes \(2\.0 MiB\).* exceeds the limit of "
                  r"1048576 bytes \(1 MiB\); raise --max-frame-mb")
    assert ping_without_token(node)


def ping_without_token(proc: Proc) -> bool:
    with connect(ComputeNode.Client, HOST, proc.port, read_timeout=CASE_SECONDS) as c:
        return c.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)).protocol_version \
            == PROTOCOL_VERSION


# ------------------------------------------------------- hostile peers
IDLE_SECONDS = 1.0  # the servers' --idle-timeout and --frame-timeout
PER_PEER = 24  # the servers' --max-connections-per-peer
TINY_ELEMENTS = 1_000_000  # elements of the token-less request


def silent_and_extra_connections(port: int) -> None:
    """PER_PEER + 10 connections that send nothing: the extra ones are refused at
    once, the others closed after the idle timeout."""
    socks = [socket.create_connection((HOST, port), timeout=CASE_SECONDS)
             for _ in range(PER_PEER + 10)]
    try:
        for sock in socks:
            assert hangs_up_within(sock, IDLE_SECONDS + CASE_SECONDS), "a silent connection"
    finally:
        for sock in socks:
            sock.close()


def trickled_frame(port: int) -> None:
    """A 10 MiB frame header, then a byte at a time: cut off at the frame timeout."""
    with socket.create_connection((HOST, port), timeout=CASE_SECONDS) as sock:
        sock.sendall(struct.pack("!i", 10 * 1024 * 1024))
        deadline = time.monotonic() + IDLE_SECONDS + CASE_SECONDS
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"x")
            except OSError:
                return  # hung up
            if hangs_up_within(sock, 0.1):
                return
        raise AssertionError("a trickled frame was not cut off")


def tiny_elements_without_token(port: int, method: str, args: Any) -> bytes:
    """A token-less request of TINY_ELEMENTS empty tensors; the server's reply."""
    payload = framed(message(method, args))  # first: encoding takes longer than the timeouts
    with socket.create_connection((HOST, port), timeout=CASE_SECONDS * 4) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        for _ in range(1000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def newer_ping(token: str) -> bytes:
    """A ping whose request carries fields this version does not know: binary bytes
    that are not UTF-8, and a Tensor."""
    request = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token=token)
    buffer = TMemoryBuffer()
    request.write(TBinaryProtocol(buffer))
    junk = b"\xff\xfe\x80 not utf-8"
    extra = (struct.pack("!bhi", TType.STRING, 70, len(junk)) + junk
             + struct.pack("!bh", TType.STRUCT, 71)
             + struct.pack("!bhi", TType.STRING, 4, len(junk)) + junk + b"\x00")
    return framed(call_header("ping") + extra + buffer.getvalue() + b"\x00")


def answers_newer_ping(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=CASE_SECONDS) as sock:
        sock.sendall(newer_ping(TOKEN))
        (size,) = struct.unpack("!i", sock.recv(4, socket.MSG_WAITALL))
        protocol = TBinaryProtocol(TMemoryBuffer(sock.recv(size, socket.MSG_WAITALL)))
        protocol.readMessageBegin()
        result = ComputeNode.ping_result()  # Coordinator's ping_result has the same fields
        result.read(protocol)
        return result.success is not None and result.success.protocol_version == PROTOCOL_VERSION


def test_hostile_peers_are_cut_off_and_both_servers_keep_serving(
    cluster: Cluster, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags = ["--token-file", str(token_file), "--max-frame-mb", str(MAX_FRAME_MB),
             "--idle-timeout", str(IDLE_SECONDS), "--frame-timeout", str(IDLE_SECONDS),
             "--max-connections-per-peer", str(PER_PEER)]
    node = cluster.add_node(0.0, *flags)
    coordinator = cluster.start_coordinator(2, *flags)
    tiny = work_request()
    tiny.weights = [ttypes.Tensor() for _ in range(TINY_ELEMENTS)]  # 1 byte each on the wire
    targets = [
        (ComputeNode, node, "train_with_weights", ComputeNode.train_with_weights_args(
            request=tiny)),
        (Coordinator, coordinator, "submit_result", Coordinator.submit_result_args(
            request=ttypes.SubmitRequest(
                protocol_version=PROTOCOL_VERSION, node="n", run_id="fuzz", unit_id="u",
                attempt=1, result=ttypes.TrainResult(True, ttypes.UnitOutcome.COMPLETED,
                                                     tiny.weights, 4, 0.1, 0.2, 0.0, 0.0)))),
    ]
    started = time.monotonic()
    for service, proc, method, args in targets:
        ping(service, proc)
        before = resident_bytes(proc)
        silent_and_extra_connections(proc.port)
        trickled_frame(proc.port)
        reply = tiny_elements_without_token(proc.port, method, args)
        assert b"requires a token" in reply, f"{service.__name__}: {reply[:200]!r}"
        assert answers_newer_ping(proc.port), service.__name__
        assert proc.alive(), cluster.logs()
        assert ping(service, proc).protocol_version == PROTOCOL_VERSION
        grown = resident_bytes(proc) - before
        assert grown < RSS_GROWTH_LIMIT, f"{service.__name__} grew by {grown / 2**20:.0f} MiB"
        refusals = re.findall(r"refused \d+ connection", proc.log())
        assert len(refusals) == 1, f"{service.__name__} logged {len(refusals)} refusal lines"
    assert time.monotonic() - started < FUZZ_SECONDS
