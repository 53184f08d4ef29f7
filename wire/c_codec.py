"""Thrift's C codec (`fastbinary`) for small structs, under the wire's limits.

`wire.transport.WireProtocol` codes in pure Python so that big binaries stay where they
are: decoded as views of the received frame, sent from the tensor's own memory, and of
2 GiB or more with the `BIG_BINARY` length word. Most messages are small, though (a unit's
request and reply of a small model weigh a few KiB), and for them Python's cost per field
is most of a call's CPU: the C codec decodes such a reply about six times faster and
encodes a request over ten times faster. This module says which structs it may take and
runs it; WireProtocol codes everything else, and everything the C codec fails on, in
Python as before:

* decoding: a struct that starts in a whole frame (not a chunked message) of under
  `SMALL_BYTES`, from a copy of the frame's rest (binary fields then come back as `bytes`,
  not views; copying that little costs less than a view per field);
* encoding: a struct whose binaries are each under the transport's `LARGE_WRITE_BYTES`
  (those the transport would copy anyway) and together under `SMALL_BYTES`; binaries that
  are not `bytes` (views of arrays) are handed to it as copies, in a shallow copy of the
  struct (the caller's objects are never changed).

Limits hold on this path too: the C decoder gets the protocol's string limit and a
container limit no higher than the bytes it decodes (no valid container has more
elements than bytes, and the C decoder allocates a list of the claimed length before it
reads an element); it reads nothing beyond the copy, and it refuses structs nested deeper
than `MAX_DEPTH` (this module's import checks that it does). What it refuses, the caller
decodes again in Python, which raises what it always raised: a peer gets through this path
nothing that the Python path refuses. One known difference: a bool byte other than 0 or 1
reads as False here and True in Python (every Thrift writer sends 0 or 1).
"""

from __future__ import annotations

import struct
from typing import Any

from thrift.protocol import fastbinary
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TType
from thrift.transport.TTransport import TMemoryBuffer

SMALL_BYTES = 1024 * 1024  # as wire.transport's _MMAP_FRAME_BYTES: smaller frames are bytearrays
MAX_DEPTH = 64  # nesting the C decoder refuses beyond, as the Python one does in skip
_BINARY = "BINARY"  # a string field's type argument in thrift_spec when it is binary
_CONTAINERS = (TType.LIST, TType.SET)


class _Decoding:
    """What the C decoder reads from its second argument: the bytes and the limits."""

    __slots__ = ("trans", "string_length_limit", "container_length_limit")

    def __init__(self, data: bytes, string_limit: int, container_limit: int) -> None:
        self.trans = TMemoryBuffer(data)
        self.string_length_limit = string_limit
        self.container_length_limit = container_limit


def decode(obj: Any, typeargs: list[Any], data: bytes, string_limit: int | None,
           container_limit: int | None) -> tuple[Any, int] | None:
    """`obj` (or a new struct of `typeargs`' class when None) decoded from the start of
    `data`, and the bytes it took; None when the C decoder refused them (an error or a
    limit), with `obj` as it was."""
    if string_limit is not None and len(data) > string_limit:
        return None  # the Python path's string limit is never looser than the data
    limit = len(data) if container_limit is None else min(container_limit, len(data))
    source = _Decoding(data, _c_limit(string_limit), limit)
    state = None if obj is None else obj.__dict__.copy()
    try:
        decoded = fastbinary.decode_binary(obj, source, typeargs)
        if _replaced_text(decoded, typeargs[0]):
            raise UnicodeError("text that is not UTF-8")  # which Python refuses
    except Exception:  # noqa: BLE001 - whatever the C decoder raises, Python decodes again
        if state is not None:
            obj.__dict__.clear()
            obj.__dict__.update(state)
        return None
    return decoded, source.trans.cstringio_buf.tell()


def encode(obj: Any, typeargs: list[Any], large_write_bytes: int) -> bytes | None:
    """`obj` in the binary protocol, from the C encoder; None when it is not small enough
    (see the module's docstring) or the C encoder failed on it."""
    try:
        ready = _ready_struct(obj, typeargs[0], _Budget(large_write_bytes))
    except Exception:  # noqa: BLE001 - too big, or values the Python encoder will judge
        return None
    try:
        return fastbinary.encode_binary(ready, typeargs)
    except Exception:  # noqa: BLE001 - the Python encoder raises what it always raised
        return None


class _NotSmall(Exception):
    """A binary too big for the C encoder (or one it cannot read), found on the way."""


class _Budget:
    """Binary bytes met so far, against the limits of the C encoder's path."""

    def __init__(self, large_write_bytes: int) -> None:
        self.each = large_write_bytes
        self.left = SMALL_BYTES

    def binary(self, value: Any) -> bytes:
        """`value` as bytes (a copy only once it is known to be small)."""
        view = None if type(value) is bytes else memoryview(value)
        size = len(value) if view is None else view.nbytes
        self.left -= size
        if size >= self.each or self.left < 0 or (view is not None and not view.c_contiguous):
            raise _NotSmall
        return value if view is None else view.tobytes()


def _ready_struct(obj: Any, cls: type, budget: _Budget) -> Any:
    """`obj`, or a shallow copy whose binaries are `bytes` (raises _NotSmall)."""
    fields = binary_fields(cls)
    if not fields:
        return obj
    changed: dict[str, Any] = {}
    for name, ttype, typeargs in fields:
        value = getattr(obj, name, None)
        if value is not None:
            ready = _ready_value(value, ttype, typeargs, budget)
            if ready is not value:
                changed[name] = ready
    if not changed:
        return obj
    copy = cls.__new__(cls)
    copy.__dict__.update(obj.__dict__)
    copy.__dict__.update(changed)  # not setattr: exceptions' instances refuse it
    return copy


def _ready_value(value: Any, ttype: int, typeargs: Any, budget: _Budget) -> Any:
    if ttype == TType.STRING:
        return budget.binary(value)
    if ttype == TType.STRUCT:
        return _ready_struct(value, typeargs[0], budget)
    if ttype in _CONTAINERS:
        etype, eargs = typeargs[0], typeargs[1]
        items = [_ready_value(item, etype, eargs, budget) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return set(items) if ttype == TType.SET else items
    if ttype == TType.MAP:
        ktype, kargs, vtype, vargs = typeargs[:4]
        pairs = {_ready_value(k, ktype, kargs, budget): _ready_value(v, vtype, vargs, budget)
                 for k, v in value.items()}
        return pairs
    return value


def _replaced_text(value: Any, cls: type) -> bool:
    """Whether a decoded struct holds text with U+FFFD, the C decoder's stand-in for bytes
    that are not UTF-8, where Python refuses the message (the character itself, sent as
    UTF-8, is rare enough to be decoded again in Python)."""
    for name, ttype, typeargs in text_fields(cls):
        field = getattr(value, name, None)
        if field is not None and _replaced_in(field, ttype, typeargs):
            return True
    return False


def _replaced_in(value: Any, ttype: int, typeargs: Any) -> bool:
    if ttype == TType.STRING:
        return _REPLACEMENT in value
    if ttype == TType.STRUCT:
        return _replaced_text(value, typeargs[0])
    if ttype in _CONTAINERS:
        return any(_replaced_in(item, typeargs[0], typeargs[1]) for item in value)
    if ttype == TType.MAP:
        ktype, kargs, vtype, vargs = typeargs[:4]
        return any(_replaced_in(k, ktype, kargs) or _replaced_in(v, vtype, vargs)
                   for k, v in value.items())
    return False


_TEXT = "UTF8"  # a string field's type argument in thrift_spec when it is text
_REPLACEMENT = "\ufffd"
_FIELDS: dict[tuple[type, str], tuple[tuple[str, int, Any], ...]] = {}


def binary_fields(cls: type) -> tuple[tuple[str, int, Any], ...]:
    """The fields of struct `cls` that hold binaries, directly or inside (name, type,
    type arguments); computed once per class."""
    return _fields_holding(cls, _BINARY)


def text_fields(cls: type) -> tuple[tuple[str, int, Any], ...]:
    """The fields of struct `cls` that hold text (UTF-8 strings), directly or inside."""
    return _fields_holding(cls, _TEXT)


def _fields_holding(cls: type, kind: str) -> tuple[tuple[str, int, Any], ...]:
    fields = _FIELDS.get((cls, kind))
    if fields is None:
        fields = _FIELDS[(cls, kind)] = _fields_with(cls, kind, set())
    return fields


def _fields_with(cls: type, kind: str, seen: set[type]) -> tuple[tuple[str, int, Any], ...]:
    seen = seen | {cls}
    return tuple((spec[2], spec[1], spec[3]) for spec in cls.thrift_spec or ()
                 if spec is not None and _holds(spec[1], spec[3], kind, seen))


def _holds(ttype: int, typeargs: Any, kind: str, seen: set[type]) -> bool:
    """Whether a value of this type holds strings of `kind` (BINARY or UTF8)."""
    if ttype == TType.STRING:
        return typeargs == kind
    if ttype in _CONTAINERS:
        return _holds(typeargs[0], typeargs[1], kind, seen)
    if ttype == TType.MAP:
        return (_holds(typeargs[0], typeargs[1], kind, seen)
                or _holds(typeargs[2], typeargs[3], kind, seen))
    if ttype == TType.STRUCT:  # a struct within itself (a tree) may: it is walked too
        cls = typeargs[0]
        return cls in seen or bool(_fields_with(cls, kind, seen))
    return False


def _c_limit(limit: int | None) -> int:
    """A limit as the C decoder reads it: a C long, None meaning none."""
    return 2**31 - 1 if limit is None else min(limit, 2**31 - 1)


def _refuses_deep_nesting() -> bool:
    """Whether the C decoder stops at MAX_DEPTH nested structs rather than recursing as
    deep as a message says (and overflowing the C stack): older Thrift releases did not."""
    field = struct.Struct("!bh")
    deep = field.pack(TType.STRUCT, 1) * (MAX_DEPTH + 1) + b"\x00" * (MAX_DEPTH + 2)

    class Probe:
        def __init__(self, inner: Any = None) -> None:
            self.inner = inner

    inner: list[Any] = [Probe, None]
    Probe.thrift_spec = (None, (1, TType.STRUCT, "inner", inner, None))  # type: ignore[attr-defined]
    inner[1] = Probe.thrift_spec  # type: ignore[attr-defined]  # a struct holding itself
    try:
        fastbinary.decode_binary(Probe(), _Decoding(deep, 2**31 - 1, 2**31 - 1),
                                 [Probe, Probe.thrift_spec])
    except TProtocolException:
        return True
    except Exception:  # noqa: BLE001 - any other refusal is no depth limit
        return False
    return False


ENABLED = _refuses_deep_nesting()
