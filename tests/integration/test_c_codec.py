"""WireProtocol's C path for small structs (wire.c_codec) against its pure-Python path.

Messages (a header, then the struct) go through a real FramedSocketTransport over a
socket pair; the same bytes are read once with the C path and once with it switched off
(`_fast_decode = None`, as generated code then reads in Python). Whatever one path
refuses the other must refuse alike, and what both take must decode to the same values.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from thrift_trainer.wire import c_codec
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.stats import encoded_size
from thrift_trainer.wire.tensor_codec import dict_to_wire, from_wire, to_wire
from thrift_trainer.wire.transport import (
    LARGE_WRITE_BYTES,
    FramedSocketTransport,
    WireProtocol,
    WireProtocolFactory,
)

WAIT = 10.0
LIMITS = WireProtocolFactory(max_frame_bytes=8 * 1024 * 1024, container_length_limit=1000)
WEIGHTS = {"W1": np.arange(128, dtype=np.float32).reshape(16, 8),
           "b1": np.ones(8, dtype=np.float32), "steps": np.arange(3, dtype=np.int64)}


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, FramedSocketTransport]]:
    """A socket to send raw frames into, and the transport that receives them."""
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(WAIT)
        right.settimeout(WAIT)
        yield left, FramedSocketTransport(right, peer="right")


def body_of(struct_: Any) -> bytes:
    """`struct_` in the binary protocol, by Thrift's own pure-Python writer."""
    buffer = TMemoryBuffer()
    struct_.write(TBinaryProtocol(buffer))
    return buffer.getvalue()


def message(body: bytes) -> bytes:
    """A frame of one reply message whose struct is `body`."""
    buffer = TMemoryBuffer()
    TBinaryProtocol(buffer).writeMessageBegin("m", TMessageType.REPLY, 1)
    data = buffer.getvalue() + body
    return struct.pack("!I", len(data)) + data


def read_struct(protocol: WireProtocol, cls: type) -> Any:
    """A message's struct of class `cls`, after its header, as a generated client reads."""
    assert protocol.readMessageBegin() == ("m", TMessageType.REPLY, 1)
    if issubclass(cls, Exception):
        return cls.read(protocol)
    value = cls()
    value.read(protocol)
    return value


def read(body: bytes, cls: type, c_path: bool) -> Any:
    """`body` sent as the struct of a connection's only message and read back as a `cls`;
    the exception it raised, as its type and message, when it was refused."""
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(WAIT)
        right.settimeout(WAIT)
        left.sendall(message(body))
        left.shutdown(socket.SHUT_WR)  # a message that reads on past its frame ends here
        protocol = LIMITS.getProtocol(FramedSocketTransport(right, peer="right"))
        if not c_path:
            protocol._fast_decode = None
        try:
            return read_struct(protocol, cls)
        except Exception as exc:  # noqa: BLE001 - compared between the two paths
            return type(exc), str(exc)


def result_struct() -> ttypes.TrainResult:
    return ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED,
                              update=dict_to_wire(WEIGHTS), num_samples=40, loss=0.5,
                              error=0.25, compute_seconds=0.01, delay_seconds=0.0,
                              message="fine", node_id="127.0.0.1:1", model_version=3)


def summary_tree(depth: int) -> ttypes.NodeSummary:
    """A relay's summary whose members nest `depth` levels deep."""
    node = ttypes.NodeSummary(node="leaf", accepted=1, rejected=0, delayed=0, failed=0,
                              cancelled=0, busy_seconds=0.5)
    for level in range(depth):
        node = ttypes.NodeSummary(node=f"relay{level}", accepted=1, rejected=0, delayed=0,
                                  failed=0, cancelled=0, busy_seconds=1.0, members=[node])
    return node


def test_the_c_codec_refuses_deep_nesting_so_the_c_path_is_on() -> None:
    assert c_codec.ENABLED


def test_a_small_reply_decodes_in_c_to_what_python_decodes() -> None:
    body = body_of(result_struct())
    fast = read(body, ttypes.TrainResult, c_path=True)
    slow = read(body, ttypes.TrainResult, c_path=False)
    assert fast == slow == result_struct()
    assert isinstance(fast.update[0].data, bytes)  # a copy: the frame is small
    assert isinstance(slow.update[0].data, memoryview)  # a view of the frame
    assert np.array_equal(from_wire(fast.update[0]), WEIGHTS["W1"])


def test_a_frame_of_a_mebibyte_or_more_still_decodes_to_views(pair) -> None:
    sock, transport = pair
    big = np.arange(2**18, dtype=np.float32)  # 1 MiB of data: the frame is over it
    body = body_of(to_wire("w", big))
    sender = threading.Thread(target=sock.sendall, args=(message(body),), daemon=True)
    sender.start()  # 1 MiB is more than a socket buffer holds
    tensor = read_struct(LIMITS.getProtocol(transport), ttypes.Tensor)
    sender.join(WAIT)
    assert isinstance(tensor.data, memoryview)
    assert np.array_equal(from_wire(tensor), big)


def test_two_messages_in_a_row_each_take_their_own_bytes(pair) -> None:
    """The C path consumes exactly its struct's bytes of the frame."""
    sock, transport = pair
    first = ttypes.NodeSummary(node="a", accepted=1, rejected=2, delayed=3, failed=4,
                               cancelled=5, busy_seconds=6.0)
    second = ttypes.NodeSummary(node="b", accepted=7, rejected=8, delayed=9, failed=10,
                                cancelled=11, busy_seconds=12.0)
    sock.sendall(message(body_of(first) + body_of(second)) + message(body_of(first)))
    protocol = LIMITS.getProtocol(transport)
    got = [read_struct(protocol, ttypes.NodeSummary), ttypes.NodeSummary()]
    got[1].read(protocol)
    assert got == [first, second]
    assert read_struct(protocol, ttypes.NodeSummary) == first  # the next frame, from its start


def test_an_exception_struct_decodes_alike() -> None:
    body = body_of(ttypes.InvalidRequest(message="no such model"))
    fast = read(body, ttypes.InvalidRequest, c_path=True)
    slow = read(body, ttypes.InvalidRequest, c_path=False)
    assert isinstance(fast, ttypes.InvalidRequest) and fast.message == slow.message


def test_a_list_over_the_container_limit_is_refused_alike() -> None:
    # update: a list of Tensor claiming one element more than the limit, then nothing
    body = (struct.pack("!bhbi", TType.LIST, 3, TType.STRUCT, 1001) + b"\x00")
    fast = read(body, ttypes.TrainResult, c_path=True)
    slow = read(body, ttypes.TrainResult, c_path=False)
    assert fast == slow
    assert "Length exceeded max allowed: 1000" in fast[1]


def test_a_claimed_length_beyond_the_frame_is_refused_alike() -> None:
    body = struct.pack("!bhi", TType.STRING, 9, 5000) + b"short"  # message: 5000 bytes
    fast = read(body, ttypes.TrainResult, c_path=True)
    assert fast == read(body, ttypes.TrainResult, c_path=False)
    assert fast[0] is TProtocolException


def test_a_big_binary_length_word_in_a_small_frame_is_refused_alike() -> None:
    body = (struct.pack("!bhi", TType.STRING, 4, -2) + struct.pack("!q", 2**31) + b"x")
    fast = read(body, ttypes.Tensor, c_path=True)
    assert fast == read(body, ttypes.Tensor, c_path=False)
    assert fast[0] is TProtocolException


@pytest.mark.parametrize("depth", [3, 63, 64, 70])
def test_nesting_decodes_or_is_refused_alike(depth: int) -> None:
    """The C decoder stops at 64 levels; deeper messages go to Python, which decides."""
    body = body_of(summary_tree(depth))
    fast = read(body, ttypes.NodeSummary, c_path=True)
    assert fast == read(body, ttypes.NodeSummary, c_path=False)


def test_an_unknown_field_nested_past_the_skip_depth_is_refused_alike() -> None:
    deep = struct.pack("!bh", TType.STRUCT, 99) * 80 + b"\x00" * 81
    fast = read(deep, ttypes.Tensor, c_path=True)
    assert fast == read(deep, ttypes.Tensor, c_path=False)
    assert fast[0] is TProtocolException


def mutations(body: bytes, count: int, seed: int) -> Iterator[bytes]:
    """`body` with one to three bytes changed, or cut short, `count` times (seeded)."""
    rng = random.Random(seed)
    for _ in range(count):
        data = bytearray(body)
        if rng.random() < 0.2:
            yield bytes(data[: rng.randrange(len(data))])
            continue
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.choice(
                [0, 1, 2, 0x7F, 0x80, 0xFF, TType.STRUCT, TType.LIST, TType.MAP, TType.STRING,
                 rng.randrange(256)])
        yield bytes(data)


def work_args() -> ComputeNode.train_with_weights_args:
    return ComputeNode.train_with_weights_args(request=ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=2, unit_id="u1", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="train_1.txt",
        config_json='{"a": 1}', weights=dict_to_wire(WEIGHTS), scheduling_policy=2,
        index_start=0, index_stop=40, model_version=1))


@pytest.mark.parametrize("make", [work_args, lambda: summary_tree(4)],
                         ids=["work request", "summary tree"])
def test_damaged_messages_decode_or_are_refused_alike(make: Any) -> None:
    """Whatever the Python path refuses the C path refuses with the same error, and what
    it takes decodes to the same values (structs without bool fields set: a bool byte
    other than 0 or 1 is the one known difference)."""
    value = make()
    body = body_of(value)
    refused = 0
    for damaged in mutations(body, 300, seed=7):
        fast = read(damaged, type(value), c_path=True)
        slow = read(damaged, type(value), c_path=False)
        assert fast == slow, damaged.hex()
        refused += isinstance(slow, tuple)
    assert 0 < refused < 300  # both kinds were met


def test_a_small_request_is_encoded_in_c_with_its_views_copied() -> None:
    args = work_args()
    request = args.request
    encoded = c_codec.encode(args, [type(args), args.thrift_spec], LARGE_WRITE_BYTES)
    assert encoded is not None
    assert isinstance(request.weights[0].data, memoryview)  # the caller's struct as it was
    back = ComputeNode.train_with_weights_args()
    back.read(TBinaryProtocol(TMemoryBuffer(encoded)))
    assert back == args
    assert encoded_size(args) == len(body_of(args))


def test_a_big_binary_is_written_by_reference_not_by_the_c_encoder(monkeypatch) -> None:
    big = np.zeros(LARGE_WRITE_BYTES // 4, dtype=np.float32)  # exactly the threshold
    tensor = to_wire("big", big)
    copies: list[int] = []
    real_view = memoryview

    class CountingView:  # a binary's view that counts its copies
        def __init__(self, value: Any) -> None:
            self._view = real_view(value)
            self.nbytes, self.c_contiguous = self._view.nbytes, self._view.c_contiguous

        def tobytes(self) -> bytes:
            copies.append(self.nbytes)
            return self._view.tobytes()

    monkeypatch.setattr(c_codec, "memoryview", CountingView, raising=False)
    assert c_codec.encode(tensor, [ttypes.Tensor, ttypes.Tensor.thrift_spec],
                          LARGE_WRITE_BYTES) is None
    assert copies == []  # refused before any copy of it
    monkeypatch.undo()
    assert c_codec.encode(tensor, [ttypes.Tensor, ttypes.Tensor.thrift_spec],
                          LARGE_WRITE_BYTES) is None
    left, right = socket.socketpair()
    with left, right:
        transport = FramedSocketTransport(left, peer="left")
        tensor.write(WireProtocol(transport))
        assert any(piece is tensor.data for piece in transport._pieces)


def test_a_struct_the_c_encoder_refuses_is_written_in_python_as_before() -> None:
    """A value of the wrong type raises what the Python encoder raises."""
    wrong = ttypes.NodeSummary(node="n", accepted="many", rejected=0, delayed=0, failed=0,
                               cancelled=0, busy_seconds=0.0)
    errors = []
    for protocol_class in (WireProtocol, TBinaryProtocol):
        with pytest.raises(Exception) as raised:  # noqa: PT011 - compared below
            wrong.write(protocol_class(TMemoryBuffer()))
        errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1]


def test_text_that_is_not_utf8_is_refused_alike_even_deep_in_a_tree() -> None:
    """The C decoder puts U+FFFD for such bytes where Python refuses the message."""
    tree = summary_tree(3)
    tree.members[0].members[0].node = "bad?"
    body = body_of(tree).replace(b"bad?", b"bad\xff")
    fast = read(body, ttypes.NodeSummary, c_path=True)
    assert fast == read(body, ttypes.NodeSummary, c_path=False)
    assert fast[0] is UnicodeDecodeError
    tree.members[0].members[0].node = "fine \ufffd"  # the character itself, sent as UTF-8
    assert read(body_of(tree), ttypes.NodeSummary, c_path=True) == tree
