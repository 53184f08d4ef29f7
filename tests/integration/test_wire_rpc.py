"""wire.rpc and wire.transport against a real server on 127.0.0.1.

Every wait is bounded: events and joins take timeouts, sockets have timeouts.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TFramedTransport, TTransportException

from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.limits import ServerLimits
from thrift_trainer.wire.rpc import (
    ConnectionFailed,
    ConnectionPool,
    ThriftServer,
    connect,
    set_read_timeout,
    transport_of,
)
from thrift_trainer.wire.tensor_codec import dict_to_wire, from_wire, to_wire, wire_to_dict
from thrift_trainer.wire.transport import FramedSocketTransport, WireProtocolFactory

WAIT = 10.0  # upper bound of every wait in this file
SERVER_MAX_FRAME = 64 * 1024 * 1024
HOST = "127.0.0.1"


class EchoNode(ComputeNode.Iface):
    """Echoes the weights back; run_id selects a misbehaviour."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        if request.protocol_version != PROTOCOL_VERSION:
            raise ttypes.VersionMismatch("version", PROTOCOL_VERSION, request.protocol_version)
        return ttypes.NodeInfo(PROTOCOL_VERSION, "echo", 0.0, 0, 0, 0, 1.0)

    def cancel_unit(self, request: ttypes.CancelUnitRequest) -> ttypes.CancelUnitResult:
        return ttypes.CancelUnitResult(cancelled=0)

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        if request.run_id == "wait":
            self.entered.set()
            self.release.wait(WAIT)
        elif request.run_id == "invalid":
            raise ttypes.InvalidRequest(message="unit_path is empty")
        elif request.run_id == "crash":
            raise RuntimeError("handler bug")
        return ttypes.TrainResult(
            accepted=True,
            outcome=ttypes.UnitOutcome.COMPLETED,
            update=request.weights,
            num_samples=len(request.weights),
            loss=0.0,
            error=0.0,
            compute_seconds=0.0,
            delay_seconds=0.0,
        )


def work(run_id: str = "r", **arrays: np.ndarray) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION,
        run_id=run_id,
        round=0,
        unit_id="u",
        attempt=1,
        algorithm="delta_avg",
        model="mlp",
        dataset="d",
        unit_path="p",
        config_json="{}",
        weights=dict_to_wire(arrays),
        scheduling_policy=1,
    )


PING = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)


@pytest.fixture
def node() -> EchoNode:
    return EchoNode()


@pytest.fixture
def server(node: EchoNode) -> Iterator[ThriftServer]:
    srv = ThriftServer(ComputeNode.Processor(node), HOST, 0, max_frame_bytes=SERVER_MAX_FRAME)
    thread = srv.serve_in_thread()
    yield srv
    node.release.set()
    srv.stop()
    thread.join(WAIT)
    assert not thread.is_alive(), "serve_forever did not return after stop()"


def client(srv: ThriftServer, **kwargs: Any) -> AbstractContextManager[ComputeNode.Client]:
    return connect(ComputeNode.Client, HOST, srv.port, **kwargs)


def assert_serving(srv: ThriftServer) -> None:
    with client(srv) as c:
        assert c.ping(PING).node_id == "echo"


def framed(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def hangs_up(sock: socket.socket) -> bool:
    """True once the server closed `sock` (EOF or reset) within the socket timeout, after
    whatever answer it sent (an HTTP client is told it reached a Thrift port)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


# ------------------------------------------------------------ round trips
def test_tensors_of_several_dtypes_round_trip_bit_exact(server: ThriftServer) -> None:
    rng = np.random.default_rng(1)
    sent = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": rng.standard_normal(7),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, size=(4,)),
        "u8": rng.integers(0, 256, size=(0, 3), dtype=np.uint8),
        "flag": np.array(True),
    }
    with client(server) as c:
        got = wire_to_dict(c.train_with_weights(work(**sent)).update)
    assert list(got) == list(sent)
    for name, arr in sent.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape
        assert got[name].tobytes() == arr.tobytes()


def test_20_mib_tensor_goes_both_ways_bit_exact(server: ThriftServer) -> None:
    big = np.random.default_rng(2).random(5 * 2**20, dtype=np.float32)  # 20 MiB
    assert big.nbytes > 16_384_000  # thrift 0.25's default limit
    with client(server) as c:
        (echo,) = c.train_with_weights(work(w=big)).update
    assert from_wire(echo).tobytes() == big.tobytes()


def test_arrays_a_caller_keeps_survive_later_calls(server: ThriftServer) -> None:
    first = np.full(2**20, 1.0, dtype=np.float32)
    second = np.full(2**20, 2.0, dtype=np.float32)
    with client(server) as c:
        kept = from_wire(c.train_with_weights(work(w=first)).update[0])
        for _ in range(3):  # frames that could reuse a receive buffer
            c.train_with_weights(work(w=second))
    assert np.array_equal(kept, first)


def test_binary_fields_decode_as_views_of_the_frame() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(WAIT)
        right.settimeout(WAIT)
        sender = FramedSocketTransport(left, peer="left")
        arr = np.arange(2**18, dtype=np.float32)  # 1 MiB: a mmap-backed frame
        to_wire("w", arr).write(WireProtocolFactory().getProtocol(sender))
        flusher = threading.Thread(target=sender.flush, daemon=True)  # 1 MiB > socket buffer
        flusher.start()
        tensor = ttypes.Tensor()
        tensor.read(WireProtocolFactory().getProtocol(FramedSocketTransport(right, peer="right")))
        flusher.join(WAIT)
    assert isinstance(tensor.data, memoryview)
    assert np.array_equal(from_wire(tensor), arr)


def test_stock_framed_client_interoperates(server: ThriftServer) -> None:
    transport = TFramedTransport(TSocket(HOST, server.port))
    transport.open()
    try:
        stock = ComputeNode.Client(TBinaryProtocol(transport))
        assert stock.ping(PING).node_id == "echo"
        (echo,) = stock.train_with_weights(work(x=np.arange(5.0))).update
        assert from_wire(echo).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        transport.close()


# -------------------------------------------------------------- exceptions
def test_declared_exceptions_reach_the_client(server: ThriftServer) -> None:
    with client(server) as c:
        with pytest.raises(ttypes.InvalidRequest, match="unit_path"):
            c.train_with_weights(work("invalid"))
        with pytest.raises(ttypes.VersionMismatch):
            c.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION + 1))
        with pytest.raises(TApplicationException):
            c.train_with_weights(work("crash"))
        assert c.ping(PING).node_id == "echo"  # the connection is still usable
    # Thrift's exceptions are immutable: leaving `connect` must not turn them into TypeError.
    with pytest.raises(ttypes.InvalidRequest), client(server) as c:
        c.train_with_weights(work("invalid"))


# ------------------------------------------------------------ hostile input
@pytest.mark.parametrize("size", [SERVER_MAX_FRAME + 1, 2**31 - 1])
def test_oversized_frame_is_refused_and_server_keeps_serving(server: ThriftServer,
                                                             size: int) -> None:
    with socket.create_connection((HOST, server.port), timeout=WAIT) as raw:
        raw.sendall(struct.pack("!i", size) + b"x" * 1024)  # then nothing more
        assert hangs_up(raw)
    assert_serving(server)


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        struct.pack("!i", -5),
        framed(b"\xff" * 8),
        framed(struct.pack("!ii", -2147418111, 1000) + b"ab"),  # name overruns its frame
    ],
)
def test_garbage_closes_that_connection_only(server: ThriftServer, garbage: bytes) -> None:
    with client(server) as bystander:
        with socket.create_connection((HOST, server.port), timeout=WAIT) as raw:
            raw.sendall(garbage)
            assert hangs_up(raw)
        assert bystander.ping(PING).node_id == "echo"
    assert_serving(server)


def test_a_message_over_the_clients_frame_limit_goes_in_chunks_within_it(
    server: ThriftServer,
) -> None:
    sent = np.arange(2**18, dtype=np.float32)  # 1 MiB
    with client(server, max_frame_bytes=256 * 1024) as c:
        (echo,) = c.train_with_weights(work(w=sent)).update
        frames = transport_of(c).frames_sent
    assert from_wire(echo).tobytes() == sent.tobytes()
    assert frames >= 1 + 4  # the announcement, then chunks of under 256 KiB


# ---------------------------------------------------------------- timeouts
def test_connect_to_a_closed_port_fails_quickly() -> None:
    with socket.create_server((HOST, 0)) as probe:
        port = probe.getsockname()[1]  # free once closed
    start = time.monotonic()
    with (
        pytest.raises(ConnectionFailed, match=f"{HOST}:{port}.*refused"),
        connect(ComputeNode.Client, HOST, port, connect_timeout=WAIT),
    ):
        pass
    assert time.monotonic() - start < 2.0


def test_read_timeout_fires_and_closes_the_connection(server: ThriftServer, node: EchoNode) -> None:
    with client(server, read_timeout=WAIT) as c:
        set_read_timeout(c, 0.2)
        with pytest.raises(TTransportException) as info:
            c.train_with_weights(work("wait"))
        assert info.value.type == TTransportException.TIMED_OUT
        assert not transport_of(c).isOpen()  # a late reply can never be misread
    assert node.entered.is_set()
    node.release.set()
    assert_serving(server)


def kernel_timeout(sock: socket.socket, option: int) -> float:
    """A socket's SO_RCVTIMEO or SO_SNDTIMEO in seconds (0: none), as the kernel keeps it
    (in its clock ticks)."""
    seconds, micros = struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, option, 16))
    return seconds + micros / 1e6


def test_a_callers_connection_waits_in_the_kernel_bounded_by_its_read_timeout(
    server: ThriftServer,
) -> None:
    """No poll before every send and receive: the socket blocks, and the kernel bounds
    each call by the read timeout (SO_RCVTIMEO, SO_SNDTIMEO), changed with it."""
    with client(server, read_timeout=WAIT) as c:
        sock = transport_of(c)._sock
        assert sock is not None and sock.gettimeout() is None
        assert kernel_timeout(sock, socket.SO_RCVTIMEO) == WAIT
        assert kernel_timeout(sock, socket.SO_SNDTIMEO) == WAIT
        set_read_timeout(c, 0.25)
        assert kernel_timeout(sock, socket.SO_RCVTIMEO) == pytest.approx(0.25, abs=0.02)  # ticks
        set_read_timeout(c, None)
        assert kernel_timeout(sock, socket.SO_RCVTIMEO) == 0.0  # none: waits for ever
        weights = {"w": np.arange(6000, dtype=np.float32)}  # a reply over the first receive
        reply = c.train_with_weights(work(**weights))
        assert np.array_equal(wire_to_dict(reply.update)["w"], weights["w"])


def test_a_reply_and_its_length_word_come_in_one_receive_and_nothing_more_is_taken() -> None:
    """A caller receives a reply's length word with what follows it; a frame split over
    receives, or longer than that first receive, is whole all the same, and bytes beyond
    the reply (never asked for) leave the connection unfit for another call."""
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(WAIT)
        right.settimeout(WAIT)
        transport = FramedSocketTransport(right, peer="right")
        big = bytes(range(256)) * 300  # 76,800 bytes: beyond the first receive
        left.sendall(struct.pack("!I", 3) + b"abc" + struct.pack("!I", len(big)) + big[:10])
        assert bytes(transport.readAll(3)) == b"abc"
        assert transport.peer_closed()  # the next frame's bytes came unasked
        left.sendall(big[10:])
        assert bytes(transport.readAll(len(big))) == big
        assert not transport.peer_closed()
        left.sendall(struct.pack("!I", 2)[:1])
        sender = threading.Timer(0.05, lambda: left.sendall(struct.pack("!I", 2)[1:] + b"ok"))
        sender.start()
        assert bytes(transport.readAll(2)) == b"ok"
        sender.join(WAIT)


def test_busy_handler_does_not_block_other_connections(
    server: ThriftServer, node: EchoNode
) -> None:
    outcome: list[ttypes.TrainResult] = []

    def slow_call() -> None:
        with client(server, read_timeout=WAIT) as c:
            outcome.append(c.train_with_weights(work("wait")))

    caller = threading.Thread(target=slow_call, daemon=True)
    caller.start()
    assert node.entered.wait(WAIT)
    assert_serving(server)  # while the handler above is still blocked
    node.release.set()
    caller.join(WAIT)
    assert len(outcome) == 1 and outcome[0].accepted


def test_idle_connections_are_closed_after_idle_timeout(node: EchoNode) -> None:
    srv = ThriftServer(ComputeNode.Processor(node), HOST, 0,
                       limits=ServerLimits(idle_timeout=0.2))
    thread = srv.serve_in_thread()
    try:
        with socket.create_connection((HOST, srv.port), timeout=WAIT) as silent:
            assert hangs_up(silent)  # well before WAIT
        assert_serving(srv)
    finally:
        srv.stop()
        thread.join(WAIT)


def test_stop_closes_open_connections_and_the_listener(node: EchoNode) -> None:
    srv = ThriftServer(ComputeNode.Processor(node), HOST, 0)
    thread = srv.serve_in_thread()
    with client(srv, read_timeout=WAIT) as c:
        assert c.ping(PING).node_id == "echo"
        srv.stop()
        thread.join(WAIT)
        assert not thread.is_alive()
        with pytest.raises(TTransportException):
            c.ping(PING)
    with pytest.raises(ConnectionFailed):
        assert_serving(srv)


# -------------------------------------------------------------------- pool
def test_pool_reuses_idle_connections_and_drops_failed_ones(server: ThriftServer) -> None:
    pool = ConnectionPool(ComputeNode.Client, HOST, server.port, read_timeout=WAIT)
    with pool.client() as c:
        first = transport_of(c)
        c.ping(PING)
    with pytest.raises(ttypes.InvalidRequest), pool.client() as c:
        assert transport_of(c) is first
        c.train_with_weights(work("invalid"))
    assert not first.isOpen()
    with pool.client() as c:
        assert transport_of(c) is not first
        assert c.ping(PING).node_id == "echo"
    pool.close()
    assert not transport_of(c).isOpen()
    with pytest.raises(RuntimeError, match="closed"), pool.client():
        pass


def test_pool_lends_one_connection_per_thread(server: ThriftServer) -> None:
    pool = ConnectionPool(ComputeNode.Client, HOST, server.port, read_timeout=WAIT)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for i in range(20):
                with pool.client() as c:
                    arr = np.full(100, i, dtype=np.int32)
                    (echo,) = c.train_with_weights(work(a=arr)).update
                    assert np.array_equal(from_wire(echo), arr)
        except BaseException as exc:  # reported below, in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    pool.close()
    assert not errors and not any(t.is_alive() for t in threads)
