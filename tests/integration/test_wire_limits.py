"""A ThriftServer against hostile peers on 127.0.0.1: idle and trickling connections,
too many connections, frames pinning memory, token-less requests and unknown fields.

Every wait is bounded: sockets have timeouts, waits poll a condition under a deadline.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from tests import waiting
from tests.hostile import recv_exactly
from tests.integration.test_wire_rpc import EchoNode, framed, hangs_up, work
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.limits import ServerLimits
from thrift_trainer.wire.rpc import (
    ACCEPT_BACKOFF_SECONDS,
    ConnectionPool,
    ThriftServer,
    connect,
    transport_of,
)
from thrift_trainer.wire.transport import WireProtocolFactory

WAIT = 10.0  # upper bound of every wait in this file
HOST = "127.0.0.1"
TOKEN = "limits-token"
PING = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
MIB = 1024 * 1024


@pytest.fixture
def serve() -> Iterator[Callable[..., ThriftServer]]:
    """Start EchoNode servers with the given ThriftServer arguments; all stopped at the end."""
    started: list[tuple[ThriftServer, Any]] = []

    def start(**kwargs: Any) -> ThriftServer:
        srv = ThriftServer(ComputeNode.Processor(kwargs.pop("node", EchoNode())), HOST, 0,
                           **kwargs)
        started.append((srv, srv.serve_in_thread()))
        return srv

    yield start
    for srv, thread in started:
        srv.stop()
        thread.join(WAIT)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    assert waiting.wait_until(condition, WAIT), f"waited {WAIT}s for {what}"


def ping(srv: ThriftServer, **kwargs: Any) -> str:
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, **kwargs) as c:
        return c.ping(PING).node_id


def message(method: str, args: Any) -> bytes:
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, TMessageType.CALL, 1)
    args.write(protocol)
    protocol.writeMessageEnd()
    return buffer.getvalue()


def reply_to(sock: socket.socket, result: Any) -> Any:
    """Read one framed reply from `sock` into the generated `result` struct."""
    (size,) = struct.unpack("!i", recv_exactly(sock, 4))
    protocol = TBinaryProtocol(TMemoryBuffer(recv_exactly(sock, size)))
    _name, kind, _seqid = protocol.readMessageBegin()
    assert kind == TMessageType.REPLY
    result.read(protocol)
    return result


# ------------------------------------------------ idle and slow connections
def test_a_frame_trickling_in_is_cut_off_at_the_frame_timeout(serve: Callable) -> None:
    srv = serve(limits=ServerLimits(idle_timeout=WAIT * 10, frame_timeout=0.5))
    payload = framed(message("ping", ComputeNode.ping_args(request=PING)))
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as slow:
        started = time.monotonic()
        for byte in payload[:-1]:  # one byte every 50 ms, never the last one
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # the server hung up already
                break
            if time.monotonic() - started > WAIT:
                break
            # The trickle's pace: 50 ms between bytes, cut short once the server hangs up.
            if select.select([slow], [], [], 0.05)[0]:
                break
        assert hangs_up(slow)
        assert time.monotonic() - started < WAIT
    assert ping(srv) == "echo"


def test_connections_beyond_the_per_peer_cap_are_refused_and_logged_once(
    serve: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    srv = serve(limits=ServerLimits(max_connections_per_peer=3))
    held = [socket.create_connection((HOST, srv.port), timeout=WAIT) for _ in range(3)]
    try:
        wait_until(lambda: srv.open_connections == 3, "three open connections")
        with caplog.at_level(logging.WARNING, logger="wire.limits"):
            for _ in range(20):
                with socket.create_connection((HOST, srv.port), timeout=WAIT) as extra:
                    assert hangs_up(extra)
        refusals = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert "127.0.0.1 holds its limit of 3 connections" in refusals[0].getMessage()
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: srv.open_connections == 0, "the held connections to close")
    assert ping(srv) == "echo"


def test_connections_beyond_the_server_cap_are_refused(serve: Callable) -> None:
    srv = serve(limits=ServerLimits(max_connections=2))
    with socket.create_connection((HOST, srv.port), timeout=WAIT), \
            socket.create_connection((HOST, srv.port), timeout=WAIT):
        wait_until(lambda: srv.open_connections == 2, "two open connections")
        with socket.create_connection((HOST, srv.port), timeout=WAIT) as extra:
            assert hangs_up(extra)
    wait_until(lambda: srv.open_connections == 0, "the held connections to close")
    assert ping(srv) == "echo"


def test_a_pooled_connection_the_server_closed_when_idle_is_replaced(serve: Callable) -> None:
    srv = serve(limits=ServerLimits(idle_timeout=0.2))
    pool = ConnectionPool(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT,
                          max_idle_seconds=WAIT * 10)
    with pool.client() as c:
        first = transport_of(c)
        assert c.ping(PING).node_id == "echo"
    wait_until(lambda: srv.open_connections == 0, "the server to close the idle connection")
    with pool.client() as c:
        assert c.ping(PING).node_id == "echo"  # on a new connection, not a failure
        assert transport_of(c) is not first
    pool.close()


def test_a_pool_does_not_lend_connections_idle_for_too_long(serve: Callable) -> None:
    srv = serve()
    pool = ConnectionPool(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT,
                          max_idle_seconds=0.05)
    with pool.client() as c:
        first = transport_of(c)
        c.ping(PING)
    returned = time.monotonic()
    wait_until(lambda: time.monotonic() > returned + 0.1, "the idle age to pass")
    with pool.client() as c:
        assert transport_of(c) is not first
    assert not first.isOpen()
    pool.close()


# --------------------------------------------------- frames pinning memory
def test_unfinished_frames_of_unauthenticated_peers_wait_for_room_in_the_budget(
    serve: Callable,
) -> None:
    srv = serve(max_frame_bytes=4 * MIB, token=TOKEN,
                limits=ServerLimits(frame_timeout=WAIT * 10, pending_frame_bytes=4 * MIB))
    budget = srv.frame_budget
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as first, \
            socket.create_connection((HOST, srv.port), timeout=WAIT) as second:
        first.sendall(struct.pack("!i", 3 * MIB) + b"x" * 1024)  # then nothing, for now
        wait_until(lambda: budget.claimed == 3 * MIB, "the first frame's claim")
        second.sendall(struct.pack("!i", 2 * MIB) + b"y" * 1024)
        wait_until(lambda: budget.waiting == 1, "the second frame to wait for room")
        assert budget.claimed == 3 * MIB  # 5 MiB would not fit in 4
        first.sendall(b"x" * (3 * MIB - 1024))  # complete (garbage): its claim ends
        assert hangs_up(first)
        wait_until(lambda: budget.claimed == 2 * MIB, "the second frame's claim")
    wait_until(lambda: budget.claimed == 0, "the claims to be given back")
    assert ping(srv, token=TOKEN) == "echo"


def test_authenticated_connections_receive_frames_outside_the_budget(serve: Callable) -> None:
    srv = serve(max_frame_bytes=8 * MIB, token=TOKEN,
                limits=ServerLimits(pending_frame_bytes=8 * MIB))
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, token=TOKEN) as c:
        c.ping(PING)  # authenticates the connection
        assert transport_of(c).isOpen()
        big = work(w=np.ones(MIB, dtype=np.float32))  # 4 MiB of weights
        assert c.train_with_weights(big).accepted
    assert srv.frame_budget.claimed == 0


# ------------------------------------------------ token before decoding
def test_a_request_without_the_token_is_refused_before_it_is_decoded(
    serve: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []
    original = ttypes.Tensor.read
    monkeypatch.setattr(ttypes.Tensor, "read",
                        lambda self, iprot: (decoded.append(1), original(self, iprot))[1])
    node = EchoNode()
    srv = serve(node=node, token=TOKEN)
    request = work()
    request.weights = [ttypes.Tensor() for _ in range(1000)]  # many tiny elements
    payload = message("train_with_weights", ComputeNode.train_with_weights_args(request=request))
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        sock.sendall(framed(payload))
        result = reply_to(sock, ComputeNode.train_with_weights_result())
    assert result.denied is not None and "requires a token" in result.denied.message
    assert decoded == []
    assert not node.entered.is_set()
    assert ping(srv, token=TOKEN) == "echo"


def test_a_request_with_a_wrong_token_is_refused_and_the_connection_kept(
    serve: Callable,
) -> None:
    srv = serve(token=TOKEN)
    wrong = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token="wrong")
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        for _ in range(2):  # the refused request is dropped whole: the next one parses
            sock.sendall(framed(message("ping", ComputeNode.ping_args(request=wrong))))
            result = reply_to(sock, ComputeNode.ping_result())
            assert result.denied is not None and "does not match" in result.denied.message


# ------------------------------------------------------- unknown fields
def with_unknown_fields(request_bytes: bytes) -> bytes:
    """A request struct's bytes with two fields a newer peer might add in front: a
    binary holding bytes that are not UTF-8, and a Tensor-shaped struct."""
    junk = b"\xff\xfe\x80 not utf-8 \xc3"
    binary = struct.pack("!bhi", TType.STRING, 60, len(junk)) + junk
    tensor = (struct.pack("!bh", TType.STRUCT, 61)
              + struct.pack("!bhi", TType.STRING, 4, len(junk)) + junk
              + struct.pack("!bhbi", TType.LIST, 3, TType.I64, 1) + struct.pack("!q", 7)
              + b"\x00")
    return binary + tensor + request_bytes


def test_an_older_server_skips_a_newer_peers_unknown_binary_fields(serve: Callable) -> None:
    srv = serve(token=TOKEN)
    request = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, token=TOKEN)
    buffer = TMemoryBuffer()
    request.write(TBinaryProtocol(buffer))
    name = b"ping"
    body = (struct.pack("!iI", TBinaryProtocol.VERSION_1 | TMessageType.CALL, len(name)) + name
            + struct.pack("!i", 5) + struct.pack("!bh", TType.STRUCT, 1)
            + with_unknown_fields(buffer.getvalue()) + b"\x00")
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        sock.sendall(framed(body))
        result = reply_to(sock, ComputeNode.ping_result())
    assert result.success is not None and result.success.node_id == "echo"


# ---------------------------------------------- out of file descriptors
class FailingListener:
    """A listening socket whose accept fails as it does when descriptors run out."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real
        self.attempts: list[float] = []

    def fileno(self) -> int:
        return self.real.fileno()

    def accept(self) -> tuple[socket.socket, Any]:
        self.attempts.append(time.monotonic())
        raise OSError(errno.EMFILE, "Too many open files")

    def close(self) -> None:
        self.real.close()


def test_failing_accepts_back_off_and_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv = ThriftServer(ComputeNode.Processor(EchoNode()), HOST, 0)
    listener = FailingListener(srv._listener)
    srv._listener = listener  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING):
        thread = srv.serve_in_thread()
        try:
            with socket.create_connection((HOST, srv.port), timeout=WAIT):  # now pending
                wait_until(lambda: len(listener.attempts) >= 3, "three accept attempts")
        finally:
            srv.stop()
            thread.join(WAIT)
    first, third = listener.attempts[0], listener.attempts[2]
    assert third - first >= 2 * ACCEPT_BACKOFF_SECONDS * 0.9  # not spinning
    failures = [r for r in caplog.records if "Too many open files" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]


def test_an_older_client_skips_a_newer_servers_unknown_fields_in_a_reply() -> None:
    info = ttypes.NodeInfo(PROTOCOL_VERSION, "newer", 0.0, 0, 0, 0, 1.0)
    buffer = TMemoryBuffer()
    info.write(TBinaryProtocol(buffer))
    data = with_unknown_fields(buffer.getvalue())
    decoded = ttypes.NodeInfo()
    decoded.read(WireProtocolFactory().getProtocol(TMemoryBuffer(data)))
    assert decoded == info
