"""wire.frame_scan: a request's method and token read from raw bytes, nothing decoded."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType, TType
from thrift.transport.TTransport import TMemoryBuffer

from thrift_trainer.wire.frame_scan import ScanError, scan_call, skip_value
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire


def message(method: str, args: Any, seqid: int = 9, strict: bool = True) -> memoryview:
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer, strictWrite=strict)
    protocol.writeMessageBegin(method, TMessageType.CALL, seqid)
    args.write(protocol)
    protocol.writeMessageEnd()
    return memoryview(buffer.getvalue())


def work(token: str | None) -> ttypes.WorkRequest:
    weights = dict_to_wire({"w": np.ones((3, 4), np.float32), "b": np.zeros(4, np.int64)})
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="a.txt",
        config_json="{}", weights=weights, scheduling_policy=2, index_start=0, index_stop=5,
        token=token)


@pytest.mark.parametrize("strict", [True, False])
def test_the_token_after_the_weights_is_found(strict: bool) -> None:
    frame = message("train_with_weights",
                    ComputeNode.train_with_weights_args(request=work("s3cret")), strict=strict)
    call = scan_call(frame)
    assert (call.method, call.message_type, call.seqid, call.token) == (
        "train_with_weights", TMessageType.CALL, 9, b"s3cret")


def test_a_request_without_a_token_scans_as_none() -> None:
    frame = message("status", Coordinator.status_args(request=ttypes.StatusRequest(run_id="x")))
    assert scan_call(frame).token is None


def test_skip_value_ends_where_the_struct_ends() -> None:
    buffer = TMemoryBuffer()
    work(None).write(TBinaryProtocol(buffer))
    data = memoryview(buffer.getvalue() + b"tail")
    assert skip_value(data, 0, TType.STRUCT) == len(data) - 4


def test_maps_sets_and_fixed_size_lists_are_skipped() -> None:
    body = (struct.pack("!bbi", TType.STRING, TType.I32, 2)
            + struct.pack("!i", 1) + b"a" + struct.pack("!i", 5)
            + struct.pack("!i", 2) + b"bc" + struct.pack("!i", 6))
    assert skip_value(memoryview(body), 0, TType.MAP) == len(body)
    doubles = struct.pack("!bi", TType.DOUBLE, 1000) + b"\0" * 8000
    assert skip_value(memoryview(doubles), 0, TType.SET) == len(doubles)


@pytest.mark.parametrize("data", [
    b"",                                                      # nothing
    struct.pack("!iI", -2**31, 4) + b"ping",                  # a bad version
    struct.pack("!iI", TBinaryProtocol.VERSION_1 | 1, 99),    # a name past the end
    struct.pack("!iI", TBinaryProtocol.VERSION_1 | 1, 4) + b"ping" + struct.pack("!i", 1)
    + struct.pack("!bhi", TType.STRING, 3, -1),               # a negative length
    struct.pack("!iI", TBinaryProtocol.VERSION_1 | 1, 4) + b"ping" + struct.pack("!i", 1)
    + struct.pack("!bhbi", TType.LIST, 3, TType.I64, 2**30),  # more elements than bytes
    struct.pack("!iI", TBinaryProtocol.VERSION_1 | 1, 4) + b"ping" + struct.pack("!i", 1)
    + struct.pack("!bh", 99, 3),                              # an unknown type
])
def test_malformed_messages_raise_scan_error(data: bytes) -> None:
    with pytest.raises(ScanError):
        scan_call(memoryview(data))


def test_nesting_beyond_the_depth_limit_raises_scan_error() -> None:
    deep = struct.pack("!bh", TType.STRUCT, 1) * 100 + b"\0" * 101
    head = struct.pack("!iI", TBinaryProtocol.VERSION_1 | 1, 4) + b"ping" + struct.pack("!i", 1)
    with pytest.raises(ScanError, match="deeper"):
        scan_call(memoryview(head + struct.pack("!bh", TType.STRUCT, 2) + deep))
