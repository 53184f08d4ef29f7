"""Messages bigger than a chunk (wire.chunks) between real sockets on 127.0.0.1: both ways,
bit exact, every frame within the receiver's limit; refusals that name the limit; broken
and interrupted sequences dropped whole; stock clients and small messages as before.

Every wait is bounded: sockets have timeouts, waits poll a condition under a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TFramedTransport, TMemoryBuffer

from tests import waiting
from tests.hostile import (
    BROKEN_SEQUENCES,
    answer_to_announcement,
    chunked_call,
    hangs_up_within,
)
from tests.integration.test_wire_rpc import EchoNode, work
from thrift_trainer.wire.chunks import (
    ChunkSequenceError,
    MessageLimits,
    MessageRefused,
    PeerRefusedMessage,
)
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.limits import ServerLimits
from thrift_trainer.wire.rpc import ThriftServer, connect, transport_of
from thrift_trainer.wire.tensor_codec import from_wire, to_wire
from thrift_trainer.wire.transport import FramedSocketTransport, WireProtocolFactory

WAIT = 10.0  # upper bound of every wait in this file
HOST = "127.0.0.1"
KIB, MIB = 1024, 1024 * 1024
CHUNK = 64 * KIB
SMALL = MessageLimits(chunk_bytes=CHUNK)
TOKEN = "chunk-token"
PING = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)


class CountingNode(EchoNode):
    """Echoes, and counts the calls that reached it (none may, of a broken message)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        self.calls += 1
        return super().train_with_weights(request)


@pytest.fixture
def serve() -> Iterator[Callable[..., ThriftServer]]:
    started: list[tuple[ThriftServer, threading.Thread]] = []

    def start(node: EchoNode | None = None, **kwargs: Any) -> ThriftServer:
        kwargs.setdefault("messages", SMALL)
        srv = ThriftServer(ComputeNode.Processor(node or CountingNode()), HOST, 0, **kwargs)
        started.append((srv, srv.serve_in_thread()))
        return srv

    yield start
    for srv, thread in started:
        srv.stop()
        thread.join(WAIT)


def weights(mib: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(int(mib * MIB) // 4, dtype=np.float32)


def call(srv: ThriftServer, request: ttypes.WorkRequest, **kwargs: Any
         ) -> tuple[ttypes.TrainResult, FramedSocketTransport]:
    kwargs.setdefault("messages", SMALL)
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, **kwargs) as c:
        return c.train_with_weights(request), transport_of(c)


def assert_serving(srv: ThriftServer, **kwargs: Any) -> None:
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, **kwargs) as c:
        assert c.ping(PING).node_id == "echo"


# ------------------------------------------------------------- both ways
def test_a_message_of_many_chunks_goes_both_ways_bit_exact_in_frames_within_the_limit(
    serve: Callable,
) -> None:
    limit = 128 * KIB  # the server's frame limit: no frame of the 1 MiB message may exceed it
    srv = serve(max_frame_bytes=limit)
    sent = weights(1)
    result, transport = call(srv, work(w=sent), max_frame_bytes=limit)
    assert from_wire(result.update[0]).tobytes() == sent.tobytes()
    chunks_each_way = -(-sent.nbytes // CHUNK)  # at least: the message also has its fields
    assert transport.frames_sent >= 1 + chunks_each_way  # an announcement and the chunks
    assert transport.frames_received >= 2 + chunks_each_way  # its acceptance too
    assert transport.bytes_sent < sent.nbytes + 64 * KIB  # heads and fields, no copies twice


def test_a_model_bigger_than_a_frame_travels_in_chunks(serve: Callable) -> None:
    srv = serve(max_frame_bytes=1 * MIB, messages=MessageLimits(chunk_bytes=256 * KIB))
    sent = weights(3)  # three frames' worth
    result, _ = call(srv, work(w=sent), max_frame_bytes=1 * MIB,
                     messages=MessageLimits(chunk_bytes=256 * KIB))
    assert from_wire(result.update[0]).tobytes() == sent.tobytes()


def test_both_sides_count_the_same_bytes_and_frames_of_a_chunked_message() -> None:
    """A chunk the socket takes in several sends is counted whole, once."""
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(WAIT)
        right.settimeout(WAIT)
        sender = FramedSocketTransport(left, peer="left",
                                       messages=MessageLimits(chunk_bytes=256 * KIB))
        receiver = FramedSocketTransport(right, peer="right")
        arr = weights(2)
        sent = threading.Thread(target=lambda: (
            to_wire("w", arr).write(WireProtocolFactory().getProtocol(sender)), sender.flush()),
            daemon=True)
        sent.start()
        tensor = ttypes.Tensor()
        tensor.read(WireProtocolFactory().getProtocol(receiver))
        sent.join(WAIT)
    assert from_wire(tensor).tobytes() == arr.tobytes()
    assert sender.frames_sent == receiver.frames_received >= 1 + 8
    assert sender.bytes_sent == receiver.bytes_received > arr.nbytes
    assert receiver.bytes_sent == sender.bytes_received > 0  # the acceptance


def test_once_a_peer_accepted_chunks_messages_up_to_one_go_whole(serve: Callable) -> None:
    """The first 2 MiB message each way is announced (any peer takes 1 MiB frames, not
    surely 2); the acceptances say 4 MiB chunks are taken, so the next go as one frame."""
    four = MessageLimits(chunk_bytes=4 * MIB)
    srv = serve(messages=four)
    sent = weights(2)
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, messages=four) as c:
        frames = transport_of(c)
        c.train_with_weights(work(w=sent))
        # the announcement, one chunk, and the acceptance of the reply's announcement
        assert (frames.frames_sent, frames.frames_received) == (3, 3)
        (echo,) = c.train_with_weights(work(w=sent)).update
        assert (frames.frames_sent, frames.frames_received) == (4, 4)
    assert from_wire(echo).tobytes() == sent.tobytes()


def test_tensors_of_a_chunked_message_stay_valid_after_later_calls(serve: Callable) -> None:
    srv = serve()
    first, second = weights(0.5, seed=1), weights(0.5, seed=2)
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, messages=SMALL) as c:
        kept = from_wire(c.train_with_weights(work(w=first)).update[0])
        for _ in range(3):
            c.train_with_weights(work(w=second))
    assert kept.tobytes() == first.tobytes()


# ------------------------------------------------- small messages, stock peers
def framed_stock(method: str, kind: int, struct_: Any) -> bytes:
    """A message as stock framed Thrift writes it (binary protocol, strict)."""
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, kind, 7)
    struct_.write(protocol)
    protocol.writeMessageEnd()
    message = buffer.getvalue()
    return struct.pack("!i", len(message)) + message


def framed_ours(method: str, kind: int, struct_: Any) -> bytes:
    left, right = socket.socketpair()
    with left, right:
        right.settimeout(WAIT)
        transport = FramedSocketTransport(left, peer="left", messages=SMALL)
        protocol = WireProtocolFactory().getProtocol(transport)
        protocol.writeMessageBegin(method, kind, 7)
        struct_.write(protocol)
        protocol.writeMessageEnd()
        transport.flush()
        left.shutdown(socket.SHUT_WR)
        data = b""
        while part := right.recv(65536):
            data += part
    return data


def test_a_message_within_a_chunk_is_one_frame_as_stock_thrift_writes_it() -> None:
    reply = ComputeNode.train_with_weights_result(success=ttypes.TrainResult(
        accepted=True, outcome=ttypes.UnitOutcome.COMPLETED, update=work(w=weights(0.03)).weights,
        num_samples=1, loss=0.5, error=0.25, compute_seconds=0.0, delay_seconds=0.0))
    assert framed_ours("train_with_weights", TMessageType.REPLY, reply) == \
        framed_stock("train_with_weights", TMessageType.REPLY, reply)
    # A call differs in one bit only: its caller reads chunked replies.
    args = ComputeNode.train_with_weights_args(request=work(w=weights(0.03)))
    ours = bytearray(framed_ours("train_with_weights", TMessageType.CALL, args))
    stock = framed_stock("train_with_weights", TMessageType.CALL, args)
    assert ours[6] == stock[6] | 0x01  # byte 2 of the version word: CHUNKED_REPLIES
    ours[6] = stock[6]
    assert bytes(ours) == stock


def test_a_stock_client_gets_a_reply_bigger_than_a_chunk_in_one_frame(serve: Callable) -> None:
    srv = serve()
    sent = weights(1)
    transport = TFramedTransport(TSocket(HOST, srv.port))
    transport.open()
    try:
        stock = ComputeNode.Client(TBinaryProtocol(transport))
        (echo,) = stock.train_with_weights(work(w=sent)).update
    finally:
        transport.close()
    assert np.frombuffer(echo.data, dtype=np.float32).tobytes() == sent.tobytes()


# -------------------------------------------------------------- refusals
def test_a_message_over_the_receivers_limit_is_refused_before_its_payload_is_sent(
    serve: Callable,
) -> None:
    node = CountingNode()
    srv = serve(node, messages=MessageLimits(chunk_bytes=CHUNK, max_message_bytes=1 * MIB))
    with connect(ComputeNode.Client, HOST, srv.port, read_timeout=WAIT, messages=SMALL) as c:
        with pytest.raises(PeerRefusedMessage) as refused:
            c.train_with_weights(work(w=weights(2)))
        assert transport_of(c).bytes_sent < 4 * KIB  # the announcement alone
    assert str(refused.value).startswith(f"{HOST}:{srv.port} refused a message of 2.0 MiB (")
    assert str(refused.value).endswith(
        ": it takes messages of at most 1 MiB (--max-message-mb 1): raise --max-message-mb there")
    assert node.calls == 0
    assert_serving(srv)


def test_a_reply_over_the_callers_limit_is_refused_by_the_caller(serve: Callable) -> None:
    srv = serve()
    with pytest.raises(MessageRefused) as refused:
        call(srv, work(w=weights(2)),
             messages=MessageLimits(chunk_bytes=4 * MIB, max_message_bytes=1 * MIB))
    assert "refused a message of 2.0 MiB" in str(refused.value)
    assert str(refused.value).endswith(
        "this process takes messages of at most 1 MiB (--max-message-mb 1): raise "
        "--max-message-mb here")
    assert_serving(srv)


def test_chunks_shrink_to_the_receivers_frames_whatever_the_senders_settings(
    serve: Callable,
) -> None:
    """The receiver takes smaller frames than the sender's chunks (--max-frame-mb 1 against
    --chunk-mb 2): it accepts the message in chunks that fit, both ways."""
    srv = serve(max_frame_bytes=1 * MIB, messages=MessageLimits(chunk_bytes=2 * MIB))
    sent = weights(3)
    result, transport = call(srv, work(w=sent), max_frame_bytes=4 * MIB,
                             messages=MessageLimits(chunk_bytes=2 * MIB))
    assert from_wire(result.update[0]).tobytes() == sent.tobytes()
    assert transport.frames_sent >= 1 + 3  # the announcement and chunks under 1 MiB
    assert transport.frames_received >= 2 + 2  # the reply in chunks of 2 MiB


# --------------------------------------------------------------- the token
@pytest.mark.parametrize(("token", "why"), [
    (None, "requires a token and the message's announcement carried none"),
    ("wrong", "the announcement's token does not match this server's"),
])
def test_an_announcement_without_the_token_is_refused_before_any_payload(
    serve: Callable, token: str | None, why: str,
) -> None:
    node = CountingNode()
    srv = serve(node, token=TOKEN)
    request = work(w=weights(0.5))
    announcement, _ = chunked_call("train_with_weights",
                                   ComputeNode.train_with_weights_args(request=request),
                                   CHUNK, token)
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        sock.sendall(announcement)
        assert why in answer_to_announcement(sock, CHUNK)
        assert hangs_up_within(sock, WAIT)
    assert srv.frame_budget.claimed == 0
    assert node.calls == 0
    assert_serving(srv, token=TOKEN)


def test_with_the_token_a_first_message_bigger_than_the_pre_auth_budget_goes_through(
    serve: Callable,
) -> None:
    srv = serve(token=TOKEN, max_frame_bytes=1 * MIB,
                limits=ServerLimits(pending_frame_bytes=1 * MIB))
    sent = weights(3)
    result, _ = call(srv, work(w=sent), token=TOKEN, max_frame_bytes=1 * MIB)
    assert from_wire(result.update[0]).tobytes() == sent.tobytes()


def test_without_a_token_unfinished_chunks_claim_the_budget_while_they_arrive(
    serve: Callable,
) -> None:
    srv = serve(limits=ServerLimits(frame_timeout=WAIT * 10))
    announcement, frames = chunked_call(
        "train_with_weights",
        ComputeNode.train_with_weights_args(request=work(w=weights(0.5))), CHUNK)
    with socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        sock.sendall(announcement)
        assert answer_to_announcement(sock, CHUNK) is None
        sock.sendall(frames[0] + frames[1][:1000])  # chunk 2 started, not finished
        assert waiting.wait_until(lambda: srv.frame_budget.claimed == CHUNK, WAIT)
    assert waiting.wait_until(lambda: srv.frame_budget.claimed == 0, WAIT)


# ------------------------------------------------ broken and cut sequences
@pytest.mark.parametrize("case", list(BROKEN_SEQUENCES))
def test_a_broken_or_cut_chunk_sequence_is_dropped_whole_and_the_server_keeps_serving(
    serve: Callable, case: str, caplog: pytest.LogCaptureFixture,
) -> None:
    node = CountingNode()
    srv = serve(node)
    announcement, frames = chunked_call(
        "train_with_weights",
        ComputeNode.train_with_weights_args(request=work(w=weights(0.5))), CHUNK)
    assert len(frames) > 3
    with caplog.at_level(logging.WARNING, logger="wire.rpc"), \
            socket.create_connection((HOST, srv.port), timeout=WAIT) as sock:
        sock.sendall(announcement)
        assert answer_to_announcement(sock, CHUNK) is None
        sock.sendall(BROKEN_SEQUENCES[case](frames))
        if case == "cut mid-chunk":
            sock.shutdown(socket.SHUT_WR)
        assert hangs_up_within(sock, WAIT)
        if case != "cut mid-chunk":  # the transport closes first, then the server logs
            assert waiting.wait_until(
                lambda: "the message is dropped and the connection closed" in caplog.text,
                WAIT)
    assert node.calls == 0
    assert_serving(srv)


def test_a_broken_chunked_reply_fails_the_call_and_closes_the_connection() -> None:
    """A server that answers a call with chunks out of order: the caller refuses them."""
    with socket.create_server((HOST, 0)) as listener:
        port = listener.getsockname()[1]

        def misbehave() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(WAIT)
                (size,) = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))
                conn.recv(size, socket.MSG_WAITALL)  # the call: a ping
                reply = ComputeNode.ping_result(success=ttypes.NodeInfo(
                    PROTOCOL_VERSION, "x" * 300_000, 0.0, 0, 0, 0, 1.0))
                announcement, frames = chunked_call("ping", reply, CHUNK)
                conn.sendall(announcement)
                conn.recv(9, socket.MSG_WAITALL)  # the caller's acceptance
                conn.sendall(frames[1] + frames[0])
                with contextlib.suppress(OSError):
                    conn.recv(1)  # until the caller hangs up

        thread = threading.Thread(target=misbehave, daemon=True)
        thread.start()
        with connect(ComputeNode.Client, HOST, port, read_timeout=WAIT) as c:
            with pytest.raises(ChunkSequenceError, match="chunk 2 came out of order"):
                c.ping(PING)
            assert not transport_of(c).isOpen()
        thread.join(WAIT)
