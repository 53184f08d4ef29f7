"""Reading a request's method and token out of a received frame without decoding it.

A server that requires a token checks it before the generated code decodes the
request: decoding builds a Python object per container element, so a token-less
frame of many tiny elements would otherwise cost a hundred times its size in memory.
The scan only walks offsets through the binary protocol's bytes; apart from the few
it returns, it creates nothing per field or element.

Every request struct of the IDL is argument 1 of its call and carries the token as
`100: optional string token` (see thrift/trainer.thrift).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TType

REQUEST_FIELD = 1
TOKEN_FIELD = 100
MAX_DEPTH = 64

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_I64 = struct.Struct("!q")
BIG_BINARY = -2  # as wire.transport.WireProtocol writes the length of a binary over 2 GiB
_FIXED_SIZES = {TType.BOOL: 1, TType.BYTE: 1, TType.DOUBLE: 8, TType.I16: 2,
                TType.I32: 4, TType.I64: 8}


class ScanError(ValueError):
    """The frame is not a well-formed binary-protocol message."""


@dataclass(frozen=True)
class CallHead:
    """What a server needs to answer a call it refuses: method, sequence id, and token."""

    method: str
    message_type: int
    seqid: int
    token: bytes | None


def scan_call(frame: memoryview) -> CallHead:
    """The method, message type, seqid and request token of the message in `frame`."""
    pos, method, message_type, seqid = _message_begin(frame)
    request = _find_field(frame, pos, REQUEST_FIELD, TType.STRUCT)
    token = None
    if request is not None:
        value = _find_field(frame, request, TOKEN_FIELD, TType.STRING)
        if value is not None:
            size = _non_negative(_i32(frame, value))
            token = bytes(frame[value + 4 : _ahead(frame, value + 4, size)])
    return CallHead(method, message_type, seqid, token)


def message_head(frame: memoryview) -> tuple[str, int, int]:
    """The method, message type and seqid of the message `frame` starts with; the rest
    of the message may be missing."""
    _, method, message_type, seqid = _message_begin(frame)
    return method, message_type, seqid


def skip_value(frame: memoryview, pos: int, ttype: int, depth: int = MAX_DEPTH) -> int:
    """The offset just after the value of type `ttype` that starts at `pos`."""
    if depth <= 0:
        raise ScanError("message nests deeper than the protocol allows")
    if ttype in _FIXED_SIZES:
        return _ahead(frame, pos, _FIXED_SIZES[ttype])
    if ttype == TType.STRING:
        size = _i32(frame, pos)
        if size == BIG_BINARY:  # a binary over 2 GiB: its length is the i64 that follows
            return _ahead(frame, pos + 12, _non_negative(_I64.unpack_from(
                frame, _check(frame, pos + 4, 8))[0]))
        return _ahead(frame, pos + 4, _non_negative(size))
    if ttype == TType.STRUCT:
        while (field_type := _byte(frame, pos)) != TType.STOP:
            pos = skip_value(frame, _ahead(frame, pos + 1, 2), field_type, depth - 1)
        return pos + 1
    if ttype == TType.MAP:
        types = (_byte(frame, pos), _byte(frame, pos + 1))
        return _skip_elements(frame, pos + 6, types, _i32(frame, pos + 2), depth)
    if ttype in (TType.LIST, TType.SET):
        return _skip_elements(frame, pos + 5, (_byte(frame, pos),), _i32(frame, pos + 1), depth)
    raise ScanError(f"unknown field type {ttype}")


def _skip_elements(frame: memoryview, pos: int, types: tuple[int, ...], count: int,
                   depth: int) -> int:
    """Skip `count` elements (map entries: key then value) of the given types."""
    count = _non_negative(count)
    if all(t in _FIXED_SIZES for t in types):  # all the same size: one jump
        return _ahead(frame, pos, count * sum(_FIXED_SIZES[t] for t in types))
    for _ in range(count):
        for ttype in types:
            pos = skip_value(frame, pos, ttype, depth - 1)
    return pos


def _find_field(frame: memoryview, pos: int, wanted_id: int, wanted_type: int) -> int | None:
    """Offset of the value of field `wanted_id` (of `wanted_type`) of the struct at `pos`."""
    while (field_type := _byte(frame, pos)) != TType.STOP:
        field_id = _I16.unpack_from(frame, _check(frame, pos + 1, 2))[0]
        if field_id == wanted_id and field_type == wanted_type:
            return pos + 3
        pos = skip_value(frame, pos + 3, field_type, MAX_DEPTH - 1)
    return None


def _message_begin(frame: memoryview) -> tuple[int, str, int, int]:
    first = _i32(frame, 0)
    if first < 0:  # strict: version and type, then the name
        if first & TBinaryProtocol.VERSION_MASK != TBinaryProtocol.VERSION_1:
            raise ScanError(f"bad protocol version {first:#x}")
        message_type, pos = first & TBinaryProtocol.TYPE_MASK, 4
        name_size = _non_negative(_i32(frame, pos))
        name_end = _ahead(frame, pos + 4, name_size)
        name, pos = frame[pos + 4 : name_end], name_end
    else:  # old style: the name, then the type
        name_end = _ahead(frame, 4, first)
        name = frame[4:name_end]
        message_type, pos = _byte(frame, name_end), name_end + 1
    seqid = _i32(frame, pos)
    try:
        method = str(name, "utf-8")
    except UnicodeDecodeError:
        raise ScanError("method name is not UTF-8") from None
    return pos + 4, method, message_type, seqid


def _byte(frame: memoryview, pos: int) -> int:
    return frame[_check(frame, pos, 1)]


def _i32(frame: memoryview, pos: int) -> int:
    return _I32.unpack_from(frame, _check(frame, pos, 4))[0]


def _check(frame: memoryview, pos: int, size: int) -> int:
    if pos + size > len(frame):
        raise ScanError("message ends before its last field")
    return pos


def _ahead(frame: memoryview, pos: int, size: int) -> int:
    return _check(frame, pos, size) + size


def _non_negative(size: int) -> int:
    if size < 0:
        raise ScanError(f"negative length {size}")
    return size
