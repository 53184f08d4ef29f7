"""A tensor of 2 GiB or more in one binary field, whose length the protocol's i32 cannot
hold: WireProtocol writes and reads it with an i64 length, and the token scan skips it.

The arrays are numpy zeros, which the system maps lazily: nothing here touches 2 GiB.
"""

from __future__ import annotations

import struct

import numpy as np
from thrift.Thrift import TMessageType
from thrift.transport.TTransport import TTransportBase

from thrift_trainer.wire import frame_scan
from thrift_trainer.wire.generated import ComputeNode, ttypes
from thrift_trainer.wire.tensor_codec import from_wire, to_wire
from thrift_trainer.wire.transport import BIG_BINARY, WireProtocol

BIG = 2**31 + 8  # bytes: over what an i32 length says


class Pieces(TTransportBase):
    """Keeps what is written as a list of buffers (big ones by reference) and reads them
    back as views, so that a 2 GiB value is never copied."""

    def __init__(self) -> None:
        self.pieces: list[memoryview] = []
        self._index = self._offset = 0

    def write(self, buf: bytes | bytearray | memoryview) -> None:
        view = memoryview(buf).cast("B")
        self.pieces.append(view if view.nbytes > 65536 else memoryview(bytes(view)))

    def readAll(self, size: int) -> memoryview:
        view = self.pieces[self._index][self._offset:]
        if view.nbytes >= size:
            self._offset += size
            if self._offset == self.pieces[self._index].nbytes:
                self._index, self._offset = self._index + 1, 0
            return view[:size]
        out = bytearray(view)
        self._index, self._offset = self._index + 1, 0
        out += self.readAll(size - len(out))
        return memoryview(bytes(out))


def test_a_binary_over_2_gib_travels_with_a_64_bit_length() -> None:
    huge = np.zeros(BIG, dtype=np.uint8)
    transport = Pieces()
    to_wire("embedding", huge).write(WireProtocol(transport))
    lengths = b"".join(bytes(p) for p in transport.pieces if p.nbytes == 4 or p.nbytes == 8)
    assert struct.pack("!iq", BIG_BINARY, BIG) in lengths
    tensor = ttypes.Tensor()
    tensor.read(WireProtocol(transport, string_length_limit=2 * BIG))
    back = from_wire(tensor)
    assert back.shape == (BIG,) and np.shares_memory(back, huge)  # a view, never a copy


def test_the_token_scan_skips_a_binary_over_2_gib() -> None:
    request = ttypes.WorkRequest(
        protocol_version=4, run_id="r", round=1, unit_id="u", attempt=1, algorithm="a",
        model="m", dataset="d", unit_path="p", config_json="{}", scheduling_policy=1,
        weights=[to_wire("embedding", np.zeros(BIG, dtype=np.uint8))], token="secret")
    transport = Pieces()
    protocol = WireProtocol(transport)
    protocol.writeMessageBegin("train_with_weights", TMessageType.CALL, 1)
    ComputeNode.train_with_weights_args(request=request).write(protocol)
    frame = np.zeros(sum(p.nbytes for p in transport.pieces), dtype=np.uint8)
    at = 0
    for piece in transport.pieces:  # only the small pieces are written: the zeros stay lazy
        if piece.nbytes <= 65536:
            frame[at:at + piece.nbytes] = np.frombuffer(piece, dtype=np.uint8)
        at += piece.nbytes
    call = frame_scan.scan_call(memoryview(frame))
    assert (call.method, call.token) == ("train_with_weights", b"secret")
