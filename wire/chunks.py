"""Messages bigger than a chunk travel as a sequence of frames: the chunk protocol.

A Thrift message of up to `ONE_FRAME_BYTES` (1 MiB, or the sender's chunk size if that is
smaller) travels as one frame (a 4-byte big-endian length, then the message), as stock
framed Thrift sends it. A bigger one is announced and then sent in chunks, so that a model
of any size moves while every frame stays within the receiver's frame limit, which remains
a per-frame security bound:

    sender                                     receiver
    ANNOUNCE  total bytes, chunk size, token ->
                                             <- ACCEPT with the chunk size it takes,
                                                or REFUSE with the reason
    DATA 1    the message's first chunk      ->
    ...
    DATA n    its last bytes                 -> the message, whole, in one buffer

The receiver answers the announcement before any payload is sent (as HTTP's
``Expect: 100-continue``), so a refusal (a message over its ``--max-message-mb``, a
missing or wrong token) reaches the sender as one line naming the limit, its value and
the flag, without a byte of payload wasted and without a reset connection swallowing the
answer. The chunk size it accepts is the sender's or less, so that every chunk fits the
receiver's frames whatever either side's ``--max-frame-mb``; and since no process takes
frames under `ONE_FRAME_BYTES`, a message is sent as one frame only up to that size (and
up to the sender's chunk size), or up to the chunk size the peer accepted earlier on the
same connection: any bigger one is announced first.

Frames of this protocol have the top bit of their length word set; the other 31 bits
are the body's length, and the body starts with a kind byte. Every DATA frame carries its
1-based sequence number and the announced total; all chunks but the last carry exactly
the announced chunk size. A chunk out of order, repeated, missing, of another size or
with another total is refused (`ChunkSequenceError`) and the connection closed: nothing
of a message reaches the decoder before its last byte has arrived.

A call whose header sets `CHUNKED_REPLIES` in its version word says that its caller
reads chunked replies; a server chunks a reply only then, so stock Thrift clients
(which never set the bit, and whose readers ignore it) get single-frame replies as
before. Callers always may chunk requests: the protocol version (wire.version) keeps
peers of older releases out before any big message is sent.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from thrift.transport.TTransport import TTransportException

CHUNK_FLAG = 0x8000_0000  # in a frame's length word: a frame of this protocol
LENGTH_MASK = 0x7FFF_FFFF
# In a strict binary message header (0x8001_00TT): bits 8-15 are unused by the binary
# protocol and ignored by every stock reader (they take the type from the low byte).
CHUNKED_REPLIES = 0x0000_0100
_STRICT_VERSION = 0x8001_0000
_VERSION_MASK = 0xFFFF_0000

ANNOUNCE, ACCEPT, REFUSE, DATA = 1, 2, 3, 4
KIND_NAMES = {ANNOUNCE: "an announcement", ACCEPT: "an acceptance", REFUSE: "a refusal",
              DATA: "a chunk"}

MIB = 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * MIB
# Smaller chunks would let a peer hold a connection for many frame timeouts per MiB.
MIN_CHUNK_BYTES = 64 * 1024
# The smallest frame limit a process takes (--max-frame-mb 1): a message this big goes
# as one frame to any peer; a bigger one is announced, and the receiver sets the chunks.
ONE_FRAME_BYTES = MIB
MAX_TOKEN_BYTES = 4096
MAX_REASON_BYTES = 4096

_WORD = struct.Struct("!I")
_ANNOUNCE = struct.Struct("!BQIH")  # kind, total bytes, chunk bytes, token length
_ACCEPT = struct.Struct("!BI")  # kind, the chunk size the receiver takes
_DATA = struct.Struct("!BIQ")  # kind, sequence number (from 1), total bytes
DATA_HEAD_BYTES = _DATA.size
MAX_CONTROL_BYTES = _ANNOUNCE.size + MAX_TOKEN_BYTES + MAX_REASON_BYTES


def machine_memory_bytes() -> int:
    """This machine's physical memory: no message bigger than it could be held."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return 64 * 1024 * MIB


DEFAULT_MAX_MESSAGE_BYTES = machine_memory_bytes()


@dataclass(frozen=True)
class MessageLimits:
    """How a connection sends big messages and how big a peer's may be.

    chunk_bytes: messages above this size are sent in chunks of it (--chunk-mb).
    max_message_bytes: the largest message taken from a peer (--max-message-mb);
        a bigger one is refused when announced, before its payload is sent.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


class ChunkSequenceError(TTransportException):
    """A peer broke the chunk protocol (a chunk out of order, repeated, missing, of the
    wrong size or total): its connection is closed and the message dropped."""

    def __init__(self, message: str) -> None:
        super().__init__(TTransportException.UNKNOWN, message)


class MessageRefused(TTransportException):
    """This process refused a peer's message (its size, its chunks, its token); the message
    names the limit, its value and the flag that raises it."""

    def __init__(self, message: str) -> None:
        super().__init__(TTransportException.SIZE_LIMIT, message)


class PeerRefusedMessage(TTransportException):
    """The peer refused a message this process sent: `refusal` says what, `reason` why (its
    own limit, in its own words)."""

    def __init__(self, peer: str, size: int, reason: str) -> None:
        self.refusal = f"refused a message of {size_text(size)}: {reason}"
        super().__init__(TTransportException.SIZE_LIMIT, f"{peer} {self.refusal}")


def size_text(nbytes: int) -> str:
    """Bytes as people read them: "258.0 MiB (270435181 bytes)"."""
    if nbytes >= 1024 * MIB:
        return f"{nbytes / (1024 * MIB):.2f} GiB ({nbytes} bytes)"
    return f"{nbytes / MIB:.1f} MiB ({nbytes} bytes)"


def limit_text(nbytes: int) -> str:
    """A limit in MiB, as its flag takes it: "64" or "0.5"."""
    return f"{nbytes / MIB:g}"


# ------------------------------------------------------------------ frames
def control_frame(kind: int, body: bytes = b"") -> bytes:
    """A whole ANNOUNCE, ACCEPT or REFUSE frame, length word included."""
    size = 1 + len(body)
    return _WORD.pack(CHUNK_FLAG | size) + bytes((kind,)) + body


def announce(total: int, chunk: int, token: str | None) -> bytes:
    raw = (token or "").encode("utf-8")[:MAX_TOKEN_BYTES]
    body = _ANNOUNCE.pack(ANNOUNCE, total, chunk, len(raw)) + raw
    return _WORD.pack(CHUNK_FLAG | len(body)) + body


def refusal(reason: str) -> bytes:
    return control_frame(REFUSE, reason.encode("utf-8")[:MAX_REASON_BYTES])


def acceptance(chunk: int) -> bytes:
    """ACCEPT, saying the chunk size the receiver takes (at most the announced one)."""
    return _WORD.pack(CHUNK_FLAG | _ACCEPT.size) + _ACCEPT.pack(ACCEPT, chunk)


def data_header(seq: int, total: int, payload: int) -> bytes:
    """The length word and head of DATA frame `seq` carrying `payload` bytes."""
    return _WORD.pack(CHUNK_FLAG | (_DATA.size + payload)) + _DATA.pack(DATA, seq, total)


def parse_announce(body: bytes | memoryview, peer: str) -> tuple[int, int, bytes]:
    """(total, chunk, token) of an ANNOUNCE body; ChunkSequenceError if it is not one."""
    kind = body[0] if len(body) else 0
    if kind != ANNOUNCE:
        raise ChunkSequenceError(f"{peer} sent {kind_name(kind)} frame where a message "
                                 "or an announcement was due")
    if len(body) < _ANNOUNCE.size:
        raise ChunkSequenceError(f"{peer} sent a truncated announcement")
    _, total, chunk, token_size = _ANNOUNCE.unpack_from(body)
    token = bytes(body[_ANNOUNCE.size:])
    if len(token) != token_size:
        raise ChunkSequenceError(f"{peer} sent an announcement whose token length is wrong")
    return total, chunk, token


@dataclass(frozen=True)
class Answer:
    """The receiver's answer to an announcement: the chunk size it takes, or why not."""

    chunk: int = 0
    refused: str | None = None


def parse_answer(body: bytes | memoryview, peer: str, announced: int) -> Answer:
    """The answer in an ACCEPT or REFUSE body to an announcement of chunks of
    `announced` bytes; ChunkSequenceError for anything else."""
    kind = body[0] if len(body) else 0
    if kind == REFUSE:
        return Answer(refused=bytes(body[1:]).decode("utf-8", errors="replace")
                      or "no reason given")
    if kind != ACCEPT:
        raise ChunkSequenceError(f"{peer} answered an announcement with {kind_name(kind)} "
                                 "frame")
    if len(body) != _ACCEPT.size:
        raise ChunkSequenceError(f"{peer} sent a malformed acceptance")
    _, chunk = _ACCEPT.unpack_from(body)
    if not 0 < chunk <= announced:
        raise ChunkSequenceError(f"{peer} accepted chunks of {chunk} bytes where chunks of "
                                 f"at most {announced} were announced")
    return Answer(chunk=chunk)


def kind_name(kind: int) -> str:
    return KIND_NAMES.get(kind, f"an unknown (kind {kind})")


def reads_chunked_replies(message: bytes | memoryview) -> bool:
    """Whether a call's header says its caller reads chunked replies."""
    if len(message) < 4:
        return False
    (word,) = _WORD.unpack_from(message)
    return word & _VERSION_MASK == _STRICT_VERSION and bool(word & CHUNKED_REPLIES)


# ------------------------------------------------------------------ sending
def split(views: list[memoryview], total: int, chunk: int) -> Iterator[list[bytes | memoryview]]:
    """The DATA frames of a message made of `views` (`total` bytes), each as its header
    followed by slices of the views: no byte of the payload is copied."""
    seq, index, offset = 0, 0, 0
    left = total
    while left:
        seq += 1
        size = min(chunk, left)
        parts: list[bytes | memoryview] = [data_header(seq, total, size)]
        need = size
        while need:
            view = views[index]
            take = min(need, view.nbytes - offset)
            if take:
                parts.append(view[offset:offset + take])
            need -= take
            offset += take
            if offset == view.nbytes:
                index, offset = index + 1, 0
        left -= size
        yield parts


# ---------------------------------------------------------------- receiving
class Receipt:
    """Checks the DATA frames of one announced message as they arrive: sequence number,
    total and size; says where each chunk's payload goes."""

    def __init__(self, total: int, chunk: int, peer: str) -> None:
        self.total, self.chunk, self.peer = total, chunk, peer
        self.received = 0
        self.next_seq = 1

    @property
    def complete(self) -> bool:
        return self.received == self.total

    def check_word(self, word: int) -> int:
        """The body length of the next frame, which must be a DATA frame of this message."""
        if not word & CHUNK_FLAG:
            raise self._broken(f"chunk {self.next_seq} is missing: an ordinary frame came "
                               "instead")
        body = word & LENGTH_MASK
        if body < _DATA.size:
            raise self._broken(f"chunk {self.next_seq} is missing: a frame of {body} bytes "
                               "came instead")
        return body

    def check_head(self, head: bytes | memoryview, body: int) -> tuple[int, int]:
        """(offset, size) of the payload of the DATA frame whose head and body length
        these are, in the message."""
        kind, seq, total = _DATA.unpack_from(head)
        if kind != DATA:
            raise self._broken(f"chunk {self.next_seq} is missing: {kind_name(kind)} "
                               "frame came instead")
        if seq != self.next_seq:
            how = "again" if seq < self.next_seq else "out of order"
            raise self._broken(f"chunk {seq} came {how} where chunk {self.next_seq} was due")
        if total != self.total:
            raise self._broken(f"chunk {seq} says the message has {total} bytes")
        size = body - _DATA.size
        due = min(self.chunk, self.total - self.received)
        if size != due:
            raise self._broken(f"chunk {seq} carries {size} bytes where {due} were due")
        offset = self.received
        self.received += size
        self.next_seq += 1
        return offset, size

    def _broken(self, problem: str) -> ChunkSequenceError:
        return ChunkSequenceError(
            f"{self.peer} broke off a message of {self.total} bytes after {self.received}: "
            f"{problem}; the message is dropped and the connection closed")
