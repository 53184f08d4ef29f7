"""A framed Thrift transport over a TCP socket that does not copy big payloads.

The bytes on the wire are those of Thrift's `TFramedTransport` (a 4-byte
big-endian length, then one message), so stock framed peers interoperate. What
differs is where the bytes live:

* writes keep references to large buffers (a tensor's memory) instead of
  copying them, and `flush` hands everything to one `sendmsg` call;
* reads receive a whole frame with `recv_into` into one buffer and serve
  `read`/`readAll` as memoryview slices of it, so a 16 MiB binary field is
  decoded without a copy; a caller takes a reply's length word with as much of the
  reply as has come, and waits in the kernel (its timeouts set on the socket), so a
  small call is one send and one receive;
* big receive buffers are anonymous private mmaps advised to use huge pages
  (page faults on fresh 4 KiB pages cost more than the copy itself here) and
  the connection reuses its last one when nothing still refers to it.

Messages bigger than `chunk_bytes` travel as a sequence of frames (`wire.chunks`): the
receiver assembles them in one buffer, which the decoded tensors then view, so a model
of any size moves without a staging copy on either side and with no frame over the limit.

Limits are deliberate: frames above `max_frame_bytes` are refused before any
memory is allocated, chunked messages above `max_message_bytes` before any of their
payload is sent, strings may be as long as a message, containers hold at most
`DEFAULT_CONTAINER_LIMIT` elements. A server's transport (`ServerReads`) also
bounds the wait for a request and for the rest of a started frame, and receives
frames of peers not yet authenticated within a shared budget. Protocols must be
`WireProtocol`: Thrift's accelerated one copies big binaries byte by byte and cannot
read memoryviews; WireProtocol hands only small structs to the C codec (`wire.c_codec`).
"""

from __future__ import annotations

import contextlib
import hmac
import mmap
import os
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.protocol.TProtocol import TProtocolException, TProtocolFactory
from thrift.Thrift import TMessageType, TType
from thrift.transport.TTransport import CReadableTransport, TTransportBase, TTransportException

from thrift_trainer.wire import c_codec, chunks
from thrift_trainer.wire import stats as wire_stats
from thrift_trainer.wire.chunks import MessageLimits, MessageRefused, PeerRefusedMessage
from thrift_trainer.wire.limits import FrameBudget

DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024
DEFAULT_CONTAINER_LIMIT = 1_000_000

# Writes at least this big are sent from the caller's memory, not copied.
LARGE_WRITE_BYTES = 64 * 1024
# Frames at least this big are received into a reusable huge-page mmap.
_MMAP_FRAME_BYTES = 1024 * 1024
# From unauthenticated peers, frames at least this big go to a fresh mmap, whose
# memory is committed only as bytes arrive (a bytearray is committed at once).
_LAZY_FRAME_BYTES = 64 * 1024
_HUGE_PAGE_BYTES = 2 * 1024 * 1024
# Receive buffers of chunked messages kept for reuse, in all, by a process (MessageBuffers).
KEPT_MESSAGE_BYTES = 32 * 1024 * 1024
# The signed 32-bit length field of a frame cannot say more than this.
_HARD_MAX_FRAME_BYTES = 2**31 - 1
_HEADER = struct.Struct("!I")
# A caller receives a reply's length word into a buffer this big: a small reply comes whole.
_INBOX_BYTES = 16 * 1024
_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds
_MAX_I32 = 2**31 - 1
BIG_BINARY = -2  # the length word of a binary too long for an i32: an i64 length follows
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_EMPTY = memoryview(b"")
_TOKEN_FIX = ("give every process the same token: --token-file PATH or the TRAINER_TOKEN "
              "environment variable")
_MIB = 1024 * 1024
# Frame headers that are another protocol's first bytes, a peer at the wrong port. Read as
# lengths they are far above the default frame limit, so only a refused frame is checked.
# A TLS record carrying a handshake starts 0x16 0x03: a TLS client on a plaintext server.
_TLS_HANDSHAKE = b"\x16\x03"
_HTTP_RESPONSE = b"HTTP"  # "HTTP/1.1 400 ...": a client that dialled an HTTP server
_HTTP_REQUESTS = (b"GET ", b"HEAD", b"POST", b"PUT ", b"DELE", b"OPTI", b"PATC", b"CONN",
                  b"TRAC", b"PRI ")  # a browser or curl on a Thrift port

BytesLike = bytes | bytearray | memoryview

wire_stats.dump_from_environment()  # only when TRAINER_WIRE_STATS names a file


@dataclass(frozen=True)
class ServerReads:
    """How a server reads requests: the timeouts and the budget of its `ServerLimits`.

    idle_timeout: wait for the first byte of a request (None: forever).
    frame_timeout: from a frame's first byte to its last.
    budget: what frames of unauthenticated peers claim while they arrive.
    keep_buffers: whether those frames may also reuse and keep the connection's receive
        buffer, as authenticated ones do: for a server that requires no token, where no
        peer is trusted more than another and big frames are the normal case.
    """

    idle_timeout: float | None
    frame_timeout: float
    budget: FrameBudget
    keep_buffers: bool = False


def tune_socket(sock: socket.socket) -> None:
    """Turn off Nagle: each message is one write, so delaying its tail only adds latency.

    SO_SNDBUF/SO_RCVBUF are left to the kernel's autotuning on purpose: fixing
    them (1 or 4 MiB) measured no faster here and disables autotuning.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _set_kernel_timeouts(sock: socket.socket, seconds: float | None) -> None:
    """Bound each send and receive of a blocking socket in the kernel (None: no bound);
    a call past it fails with EAGAIN."""
    if seconds is None:
        value = _TIMEVAL.pack(0, 0)  # zero: wait forever
    else:
        micros = max(1, round(seconds * 1_000_000))  # zero would mean forever
        value = _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


class IdleTimeout(TTransportException):
    """A server closed a connection on which no request started within its idle timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(TTransportException.TIMED_OUT, message)


class WrongProtocol(TTransportException):
    """The peer speaks another protocol than framed Thrift (``protocol``: "HTTP" or
    "TLS"): it is the wrong port, or one side lacks a TLS setting. No frame limit helps."""

    def __init__(self, protocol: str, message: str) -> None:
        super().__init__(TTransportException.UNKNOWN, message)
        self.protocol = protocol


class FramedSocketTransport(TTransportBase, CReadableTransport):
    """Thrift framed transport bound to one connected TCP socket.

    Not thread-safe: one call at a time per connection. Any socket error or
    timeout closes the transport, because a reply that arrives late would
    otherwise be read as the answer to the next call.

    A `CReadableTransport` only so that generated code offers `WireProtocol` its C
    decoding for each struct (see `small_rest`); the C decoder never reads it directly.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        peer: str | None = None,
        server_reads: ServerReads | None = None,
        peer_host: str = "",
        messages: MessageLimits | None = None,
        token: str | None = None,
        required_token: str | None = None,
    ) -> None:
        if not 0 < max_frame_bytes <= _HARD_MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be in 1..{_HARD_MAX_FRAME_BYTES}")
        self._sock: socket.socket | None = sock
        self.max_frame_bytes = max_frame_bytes
        self.messages = messages or MessageLimits()
        # A chunk and its head must fit in a frame of ours; a peer may take smaller ones
        # (it says so when it accepts a message). Bigger messages are announced.
        self.chunk_bytes = self._chunk_room(self.messages.chunk_bytes)
        # Messages up to this size go as one frame: any peer takes 1 MiB; a peer that
        # accepted chunks of N bytes on this connection takes frames of N.
        self.one_frame_bytes = min(self.chunk_bytes, chunks.ONE_FRAME_BYTES)
        self.peer = peer or _describe_peer(sock)
        self.peer_host = peer_host  # the peer's address: its share of the frame budget
        self._header = bytearray(_HEADER.size)
        self._data_head = bytearray(chunks.DATA_HEAD_BYTES)
        self._frame: memoryview = _EMPTY
        self._pos = 0
        self._small_frame = False  # the current frame is whole and under c_codec.SMALL_BYTES
        self._spare: mmap.mmap | None = None
        # An SSLSocket has no sendmsg: it encrypts one buffer at a time.
        self._scatter = not isinstance(sock, ssl.SSLSocket)
        # Server side only: deadlines on every frame, and until the peer is
        # `authenticated` (its token checked) a budgeted, lazily committed buffer.
        self._server_reads = server_reads
        self.authenticated = False
        # Sent in announcements of chunked messages / required in a peer's, until the
        # connection is authenticated (the token of a request is at its end).
        self._token = token
        self._required_token = required_token.encode("utf-8") if required_token else None
        # A server chunks a reply only for a caller that said it reads chunked replies;
        # a caller always may chunk (wire.chunks).
        self.peer_reads_chunks = server_reads is None
        # Bytes on the wire (frame headers included), also reported to wire.stats.
        self.bytes_sent = self.bytes_received = 0
        self.frames_sent = self.frames_received = 0
        self._reset_writes()
        # A plain caller's connection waits in the kernel (SO_RCVTIMEO and SO_SNDTIMEO on a
        # blocking socket): a Python timeout polls before every send and receive, and each
        # system call lets go of the interpreter lock, which among a coordinator's hundred
        # threads costs a thread switch. A reply's length word is received with as much of
        # the reply as has come (`_ahead`), so a small reply takes one receive, not two.
        self._kernel_timeouts = server_reads is None and self._scatter
        self._timeout = sock.gettimeout()
        self._inbox = bytearray(_INBOX_BYTES) if self._kernel_timeouts else bytearray()
        self._ahead = _EMPTY  # received beyond what was read: the next reads take it first
        if self._kernel_timeouts:
            sock.settimeout(None)
            _set_kernel_timeouts(sock, self._timeout)

    # ------------------------------------------------------------ lifecycle
    def isOpen(self) -> bool:
        return self._sock is not None

    def interrupt(self) -> None:
        """From another thread: make a call blocked on this connection fail at once (its
        socket is shut down; the caller's thread then closes it as for any failure)."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def open(self) -> None:
        if self._sock is None:
            raise TTransportException(
                TTransportException.NOT_OPEN,
                f"connection to {self.peer} is closed; open a new one",
            )

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._frame, self._spare, self._ahead = _EMPTY, None, _EMPTY
        if sock is not None:
            sock.close()

    def peer_closed(self) -> bool:
        """Without waiting: whether an idle connection is unusable, because the peer
        closed it (a server's idle timeout) or sent something unasked. One poll of the
        socket (even under TLS, any byte here is unexpected): readable means either."""
        sock = self._sock
        if sock is None or self._ahead:  # bytes beyond the last reply: never asked for
            return True
        poller = select.poll()
        try:
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))  # data, end of file, a hang-up or an error
        except (OSError, ValueError):  # closed meanwhile
            return True

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send or receive (None waits forever)."""
        sock = self._socket()
        if self._kernel_timeouts:
            if seconds != self._timeout:  # setting it costs system calls
                _set_kernel_timeouts(sock, seconds)
                self._timeout = seconds
        elif sock.gettimeout() != seconds:  # setting it costs a system call even unchanged
            sock.settimeout(seconds)

    # ---------------------------------------------------------------- reads
    def read(self, sz: int) -> memoryview:
        """Up to `sz` bytes of the current frame (the next one if it is used up)."""
        if self._pos >= len(self._frame):
            self._next_frame()
        start = self._pos
        self._pos = min(start + sz, len(self._frame))
        return self._taken(start, self._pos)

    def readAll(self, sz: int) -> memoryview:
        """Exactly `sz` bytes as a zero-copy view of the received frame.

        A Thrift message never spans frames, so a read that overruns its frame
        means a malformed message; it fails at once instead of waiting.
        """
        if sz and self._pos >= len(self._frame):
            self._next_frame()
        start, end = self._pos, self._pos + sz
        if end > len(self._frame):
            raise TProtocolException(
                TProtocolException.INVALID_DATA,
                f"message from {self.peer} needs {sz} more bytes but its frame has "
                f"{len(self._frame) - start} left; the peer sent a malformed message",
            )
        self._pos = end
        return self._taken(start, end)

    def _taken(self, start: int, end: int) -> memoryview:
        """Bytes `start:end` of the current frame; once its last byte is taken, the frame
        itself is let go, so that what a connection received is held only by what was
        decoded from it (a model's tensors), not until the connection's next message."""
        view = self._frame[start:end]
        if end >= len(self._frame):
            self._frame, self._pos = _EMPTY, 0
        return view

    def current_frame(self) -> memoryview:
        """The unread rest of the current frame, receiving the next one if it is used up."""
        if self._pos >= len(self._frame):
            self._next_frame()
        return self._frame[self._pos :]

    def skip_frame(self) -> None:
        """Drop the unread rest of the current frame."""
        self._frame, self._pos = _EMPTY, 0

    def small_rest(self) -> memoryview | None:
        """Without receiving anything: the unread rest of the current frame when that is a
        whole frame (not a chunked message) of under `c_codec.SMALL_BYTES`, else None.
        (A call's struct follows its message header, which received the frame.)"""
        if not self._small_frame or self._pos >= len(self._frame):
            return None
        return self._frame[self._pos :]

    def consume(self, size: int) -> None:
        """Mark `size` bytes of the current frame read (decoded from `small_rest`)."""
        end = self._pos + size
        if end >= len(self._frame):  # let the frame go, as `_taken` does
            self._frame, end = _EMPTY, 0
        self._pos = end

    @property
    def cstringio_buf(self) -> None:
        raise TypeError("a FramedSocketTransport is read by WireProtocol, not by Thrift's "
                        "accelerated protocols")

    def cstringio_refill(self, partialread: bytes, reqlen: int) -> None:
        raise TypeError("a FramedSocketTransport is read by WireProtocol, not by Thrift's "
                        "accelerated protocols")

    def _next_frame(self) -> None:
        self._frame, self._pos = _EMPTY, 0  # our own view must not pin the old buffer
        if self._server_reads is not None:
            self._next_request_frame(self._server_reads)
            return
        self._recv_header()
        self._frame = self._frame_or_message(None)

    def _next_request_frame(self, reads: ServerReads) -> None:
        """A server's read: idle until the first byte, then the frame by its deadline."""
        header = memoryview(self._header)
        self._socket().settimeout(reads.idle_timeout)
        try:
            self._recv_exactly(header[:1])
        except TTransportException as exc:
            if exc.type != TTransportException.TIMED_OUT:
                raise
            raise IdleTimeout(f"{self.peer} sent no request for {reads.idle_timeout:g}s; "
                              "closed its connection (--idle-timeout)") from None
        deadline = time.monotonic() + reads.frame_timeout
        self._recv_by(header[1:], deadline)
        self._frame = self._frame_or_message(deadline)
        self._socket().settimeout(reads.idle_timeout)  # for the reply
        self.peer_reads_chunks = chunks.reads_chunked_replies(self._frame)

    def _frame_or_message(self, deadline: float | None) -> memoryview:
        """The frame whose length word was just received, or the chunked message that
        word announces. `deadline`: a server's, for the frame (None: the socket's timeout)."""
        (word,) = _HEADER.unpack(self._header)
        self._small_frame = False
        if word & chunks.CHUNK_FLAG:
            return self._chunked_message(word & chunks.LENGTH_MASK, deadline)
        size = self._checked_size(word)
        self._small_frame = size < c_codec.SMALL_BYTES
        if deadline is None:
            frame = memoryview(self._buffer_for(size))[:size]
            self._recv_exactly(frame)
        elif self.authenticated:
            frame = memoryview(self._buffer_for(size))[:size]
            self._recv_by(frame, deadline)
        else:
            frame = self._budgeted_frame(size, deadline)
        self._count(wire_stats.RECEIVED, _HEADER.size + size, frame)
        return frame

    def _budgeted_frame(self, size: int, deadline: float) -> memoryview:
        """Receive a frame of an unauthenticated peer: claimed from the budget while it
        arrives and, unless `keep_buffers`, in memory committed only as bytes come and
        never kept for reuse."""
        reads = self._server_reads
        assert reads is not None
        with self._claimed(size, deadline):
            if reads.keep_buffers:
                buffer = self._buffer_for(size)
            elif size < _LAZY_FRAME_BYTES:
                buffer = bytearray(size)
            else:
                buffer = _huge_page_buffer(size)
            frame = memoryview(buffer)[:size]
            self._recv_by(frame, deadline)
            return frame

    @contextlib.contextmanager
    def _claimed(self, size: int, deadline: float) -> Iterator[None]:
        """`size` bytes of the server's budget for unfinished frames, held for the block."""
        reads = self._server_reads
        assert reads is not None
        if not reads.budget.claim(size, deadline, self.peer_host):
            self.close()
            raise TTransportException(
                TTransportException.TIMED_OUT,
                f"no room for a frame of {size} bytes from {self.peer} within "
                f"{reads.frame_timeout:g}s: unfinished frames hold the server's "
                f"{reads.budget.capacity / _MIB:g} MiB budget (--max-pending-frames-mb) "
                f"or this address's {reads.budget.per_peer / _MIB:g} MiB of it")
        try:
            yield
        finally:
            reads.budget.release(size, self.peer_host)

    def _checked_size(self, size: int) -> int:
        if size > self.max_frame_bytes:
            wrong = self._other_protocol()
            if wrong is not None:
                raise wrong
            raise TTransportException(TTransportException.SIZE_LIMIT, self._refusal(size))
        return size

    # ------------------------------------------------------ chunked messages
    def _chunked_message(self, body_size: int, deadline: float | None) -> memoryview:
        """The message announced by the frame whose body comes next: the announcement is
        answered (accepted or refused), then the chunks are received in order into one
        buffer, each in place. A broken sequence closes the connection."""
        body = self._control_body(body_size, deadline)
        total, chunk, token = chunks.parse_announce(body, self.peer)
        unauthorized = self._token_refusal(token)
        if unauthorized is not None:
            self._refuse(unauthorized)
            raise TTransportException(TTransportException.UNKNOWN,
                                      f"refused a message from {self.peer}: {unauthorized}")
        refused = self._size_refusal(total, chunk)
        if refused is not None:
            self._refuse(refused.format(it="it", there="there"))
            raise MessageRefused(f"refused a message of {chunks.size_text(total)} from "
                                 f"{self.peer}: "
                                 + refused.format(it="this process", there="here"))
        chunk = self._chunk_room(chunk)
        message = MESSAGE_BUFFERS.take(total)
        self._answer(chunks.acceptance(chunk))
        receipt = chunks.Receipt(total, chunk, self.peer)
        wire, frames = _HEADER.size + body_size, 1
        try:
            while not receipt.complete:
                deadline = self._chunk_deadline(deadline)
                self._receive(memoryview(self._header), deadline)
                size = receipt.check_word(_HEADER.unpack(self._header)[0])
                self._receive(memoryview(self._data_head), deadline)
                offset, payload = receipt.check_head(self._data_head, size)
                self._receive_payload(message[offset:offset + payload], deadline)
                wire, frames = wire + _HEADER.size + size, frames + 1
        except chunks.ChunkSequenceError:
            self.close()
            raise
        self._count(wire_stats.RECEIVED, wire, message, frames)
        return message

    def _answer(self, frame: bytes) -> None:
        self._send_raw(frame)
        self._count(wire_stats.SENT, len(frame), _EMPTY)

    def _control_body(self, size: int, deadline: float | None) -> bytearray:
        if size > chunks.MAX_CONTROL_BYTES:
            self.close()
            raise chunks.ChunkSequenceError(
                f"{self.peer} sent a chunk-protocol frame of {size} bytes where an "
                f"announcement of at most {chunks.MAX_CONTROL_BYTES} was due")
        body = bytearray(size)
        self._receive(memoryview(body), deadline)
        return body

    def _refuse(self, reason: str) -> None:
        """Answer an announcement with REFUSE and close: the sender reads the reason (it
        sent no payload, so nothing unread makes the close a reset)."""
        self._answer(chunks.refusal(reason))
        self.close()

    def _token_refusal(self, token: bytes) -> str | None:
        """Why a server with a token refuses an announcement on a connection not yet
        authenticated, or None (the connection is authenticated by it)."""
        if self._required_token is None or self.authenticated:
            return None
        if not token:
            return ("this server requires a token and the message's announcement carried "
                    f"none; {_TOKEN_FIX}")
        if not hmac.compare_digest(token, self._required_token):
            return f"the announcement's token does not match this server's; {_TOKEN_FIX}"
        self.authenticated = True
        return None

    def _size_refusal(self, total: int, chunk: int) -> str | None:
        """Why a message of `total` bytes in chunks of `chunk` is refused, or None: words
        with `{it}` and `{there}` for the receiver, so that the sender and the receiver
        each say it their way."""
        if total == 0:
            return "the announcement is of an empty message"
        limit = self.messages.max_message_bytes
        if total > limit:
            return (f"{{it}} takes messages of at most {chunks.limit_text(limit)} MiB "
                    f"(--max-message-mb {chunks.limit_text(limit)}): raise --max-message-mb "
                    "{there}")
        if chunk < min(chunks.MIN_CHUNK_BYTES, total):
            return (f"chunks of {chunk} bytes are under the smallest taken, "
                    f"{chunks.MIN_CHUNK_BYTES} bytes")
        return None

    def _chunk_room(self, chunk: int) -> int:
        """`chunk`, or less where a chunk and its head would not fit our frames."""
        return max(1, min(chunk, self.max_frame_bytes - chunks.DATA_HEAD_BYTES))

    def _chunk_deadline(self, deadline: float | None) -> float | None:
        """A server's deadline for the next chunk: each within the frame timeout."""
        if deadline is None or self._server_reads is None:
            return None
        return time.monotonic() + self._server_reads.frame_timeout

    def _receive(self, view: memoryview, deadline: float | None) -> None:
        if deadline is None:
            self._recv_exactly(view)
        else:
            self._recv_by(view, deadline)

    def _receive_payload(self, view: memoryview, deadline: float | None) -> None:
        """A chunk's payload; from a peer not authenticated, claimed from the budget for
        unfinished frames while it arrives, as a frame is."""
        if deadline is None or self.authenticated:
            self._receive(view, deadline)
            return
        with self._claimed(view.nbytes, deadline):
            self._recv_by(view, deadline)

    def _recv_by(self, view: memoryview, deadline: float) -> None:
        """Receive all of `view` before the monotonic `deadline`, or close and raise."""
        sock, pos, size = self._socket(), 0, len(view)
        while pos < size:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise TTransportException(
                    TTransportException.TIMED_OUT,
                    f"{self.peer} sent {pos} of a frame's {size} bytes and no more within the "
                    "frame timeout; the connection is closed (--frame-timeout)")
            sock.settimeout(left)
            pos += self._recv_some(sock, view[pos:], size - pos)

    def _recv_some(self, sock: socket.socket, view: memoryview, wanted: int) -> int:
        try:
            got = sock.recv_into(view, wanted)
        except TimeoutError:  # the deadline passed: the caller says so
            return 0
        except OSError as exc:
            raise self._failure(exc, "receiving from") from exc
        if not got:
            raise TTransportException(
                TTransportException.END_OF_FILE,
                f"{self.peer} closed the connection {wanted} bytes short of a frame")
        return got

    def _other_protocol(self) -> WrongProtocol | None:
        """The mistake a refused frame header shows, when it is another protocol's start."""
        head = bytes(self._header)
        if head[:2] == _TLS_HANDSHAKE:
            return WrongProtocol("TLS", f"{self.peer} speaks TLS to a plaintext connection; "
                                 "start the server with --tls-cert and --tls-key, or drop "
                                 "--tls-ca on the connecting side")
        if head == _HTTP_RESPONSE:
            return WrongProtocol("HTTP", f"{self.peer} answered in HTTP: it is an HTTP server "
                                 "(a dashboard?), not a Thrift port of the trainer")
        if head in _HTTP_REQUESTS:
            return WrongProtocol("HTTP", f"{self.peer} sent an HTTP request "
                                 f"({head.decode().strip()}): this port speaks Thrift, not "
                                 "HTTP; the coordinator's dashboard has a port of its own "
                                 "(--dashboard-port)")
        return None

    def _refusal(self, size: int) -> str:
        """Why a frame header was refused, in words an operator can act on."""
        return (f"frame of {size} bytes ({size / _MIB:.1f} MiB) from {self.peer} exceeds the "
                f"limit of {self.max_frame_bytes} bytes ({self.max_frame_bytes / _MIB:g} MiB); "
                "raise --max-frame-mb here or lower --chunk-mb on the sender")

    def _buffer_for(self, size: int) -> bytearray | mmap.mmap:
        if size < _MMAP_FRAME_BYTES:
            return bytearray(size)
        spare = self._spare
        if spare is not None and len(spare) >= size and _unreferenced(spare):
            return spare
        self._spare = _huge_page_buffer(size)
        return self._spare

    def _recv_header(self) -> None:
        """A caller's read of a frame's length word, with whatever follows it that has come
        (kept in `_ahead` for the reads after it), when it waits in the kernel."""
        if not self._kernel_timeouts or self._ahead:
            self._recv_exactly(memoryview(self._header))
            return
        sock, inbox = self._socket(), memoryview(self._inbox)
        try:
            got = sock.recv_into(inbox)
        except OSError as exc:
            raise self._failure(exc, "receiving from") from exc
        if not got:
            raise TTransportException(TTransportException.END_OF_FILE,
                                      f"{self.peer} closed the connection")
        head = min(got, _HEADER.size)
        self._header[:head] = inbox[:head]
        self._ahead = inbox[head:got]
        if head < _HEADER.size:
            self._recv_exactly(memoryview(self._header)[head:])

    def _recv_exactly(self, view: memoryview) -> None:
        if self._ahead:  # what came with the frame's length word
            taken = min(len(self._ahead), len(view))
            view[:taken] = self._ahead[:taken]
            self._ahead = self._ahead[taken:]
            view = view[taken:]
        sock, pos, size = self._socket(), 0, len(view)
        try:
            while pos < size:
                got = sock.recv_into(view[pos:], size - pos)
                if not got:
                    raise TTransportException(
                        TTransportException.END_OF_FILE,
                        f"{self.peer} closed the connection"
                        + (f" {size - pos} bytes short of a frame" if pos else ""),
                    )
                pos += got
        except OSError as exc:
            raise self._failure(exc, "receiving from") from exc

    # --------------------------------------------------------------- writes
    def write(self, buf: BytesLike) -> None:
        """Queue `buf`; small writes are coalesced, large ones kept by reference."""
        size = buf.nbytes if isinstance(buf, memoryview) else len(buf)
        if size >= LARGE_WRITE_BYTES:
            self._pieces.append(self._small)
            self._pieces.append(buf)
            self._small = bytearray()
        else:
            self._small += buf
        self._size += size

    def flush(self) -> None:
        """Send the queued message: as one frame, or announced and in chunks when it is
        bigger than `one_frame_bytes` and the peer reads chunks (wire.chunks)."""
        pieces, size = [*self._pieces, self._small], self._size
        self._reset_writes()
        if size > self.one_frame_bytes and self.peer_reads_chunks:
            views = [memoryview(p).cast("B") for p in pieces]
            views[0] = views[0][_HEADER.size:]  # the room kept for a frame's length
            self._send_chunked(views, size)
            return
        if size > self.max_frame_bytes:
            raise TTransportException(
                TTransportException.SIZE_LIMIT,
                f"message of {size} bytes to {self.peer} exceeds max_frame_bytes="
                f"{self.max_frame_bytes}; raise it (--max-frame-mb) on both ends or send "
                "smaller messages",
            )
        _HEADER.pack_into(pieces[0], 0, size)
        try:
            if len(pieces) == 1:
                self._socket().sendall(pieces[0])
            else:
                self._send_pieces([memoryview(p).cast("B") for p in pieces])
        except OSError as exc:
            raise self._failure(exc, "sending to") from exc
        self._count(wire_stats.SENT, _HEADER.size + size, memoryview(pieces[0])[_HEADER.size:])

    def _send_chunked(self, views: list[memoryview], size: int) -> None:
        """Announce the message, wait for the peer to accept it, then send its chunks,
        each a frame of its header and slices of the caller's buffers (no copy)."""
        announcement = chunks.announce(size, self.chunk_bytes, self._token)
        self._send_raw(announcement)
        chunk = self._await_acceptance(size)
        wire, frames = len(announcement), 1
        try:
            for parts in chunks.split(views, size, chunk):
                frame = [memoryview(part) for part in parts]
                wire += sum(part.nbytes for part in frame)  # before: sending trims the views
                frames += 1
                self._send_pieces(frame)
        except OSError as exc:
            raise self._failure(exc, "sending to") from exc
        self._count(wire_stats.SENT, wire, views[0], frames)

    def _await_acceptance(self, size: int) -> int:
        """The chunk size the peer takes, from its answer to an announcement;
        PeerRefusedMessage (and the connection closed) when it refuses the message."""
        header = memoryview(self._header)
        self._recv_exactly(header)
        (word,) = _HEADER.unpack(header)
        body_size = word & chunks.LENGTH_MASK
        if not word & chunks.CHUNK_FLAG or body_size > chunks.MAX_CONTROL_BYTES:
            self.close()
            raise chunks.ChunkSequenceError(f"{self.peer} answered an announcement with a "
                                            "frame that is no answer")
        body = bytearray(body_size)
        self._recv_exactly(memoryview(body))
        self._count(wire_stats.RECEIVED, _HEADER.size + body_size, _EMPTY)
        try:
            answer = chunks.parse_answer(body, self.peer, self.chunk_bytes)
        except chunks.ChunkSequenceError:
            self.close()
            raise
        if answer.refused is not None:
            self.close()
            raise PeerRefusedMessage(self.peer, size, answer.refused)
        # Its frames take a chunk and its head: later messages of up to a chunk go whole,
        # without announcing them (a model of a few MiB costs no round trip per message).
        self.one_frame_bytes = max(self.one_frame_bytes, answer.chunk)
        return answer.chunk

    def _send_raw(self, data: bytes) -> None:
        """One small frame of the chunk protocol, sent at once (not queued: it may be sent
        while a reply is being read, or before the queued message); counted by the caller."""
        try:
            self._socket().sendall(data)
        except OSError as exc:
            raise self._failure(exc, "sending to") from exc

    def _reset_writes(self) -> None:
        self._pieces: list[BytesLike] = []
        self._small = bytearray(_HEADER.size)  # room for the frame length
        self._size = 0

    def _send_pieces(self, views: list[memoryview]) -> None:
        """sendmsg until every byte is out, resuming after partial sends."""
        sock, first = self._socket(), 0
        if not self._scatter:
            for view in views:  # one TLS write per piece: big tensors are still not copied
                sock.sendall(view)
            return
        while first < len(views):
            sent = sock.sendmsg(views[first : first + _IOV_MAX])
            while first < len(views) and sent >= views[first].nbytes:
                sent -= views[first].nbytes
                first += 1
            if sent:
                views[first] = views[first][sent:]

    # -------------------------------------------------------------- helpers
    def _count(self, direction: str, nbytes: int, message: memoryview,
               frames: int = 1) -> None:
        """Count `frames` frames of `nbytes` on the wire (length words included) that
        carry the message starting `message`."""
        if direction == wire_stats.SENT:
            self.bytes_sent += nbytes
            self.frames_sent += frames
        else:
            self.bytes_received += nbytes
            self.frames_received += frames
        wire_stats.WIRE_STATS.record(direction, self.peer, nbytes, message, frames)

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self.open()  # raises NOT_OPEN
        return self._sock  # type: ignore[return-value]

    def _failure(self, exc: OSError, doing: str) -> TTransportException:
        timeout = self._timeout if self._kernel_timeouts else (
            self._sock.gettimeout() if self._sock is not None else None)
        self.close()
        # a kernel timeout ends a blocking call with EAGAIN
        if isinstance(exc, TimeoutError) or (self._kernel_timeouts
                                             and isinstance(exc, BlockingIOError)):
            return TTransportException(
                TTransportException.TIMED_OUT,
                f"timed out {doing} {self.peer} after {timeout}s; the connection is closed "
                "(raise the read timeout for long calls)",
                exc,
            )
        return TTransportException(
            TTransportException.UNKNOWN, f"error {doing} {self.peer}: {exc}", exc
        )


class WireProtocol(TBinaryProtocol):
    """The pure-Python binary protocol, reading strings from memoryviews.

    Binary fields come back as memoryviews of the received frame (zero copy);
    strings are decoded to `str` as usual. A binary of 2 GiB or more, whose length the
    protocol's i32 cannot hold (a tensor of a big model), has the length word
    `BIG_BINARY` followed by an i64 length: stock peers, which could not take such a value
    anyway, never see it otherwise.

    Small structs go through Thrift's C codec instead (`wire.c_codec`: binaries of small
    frames then come back as `bytes`); generated code offers it every struct it reads
    or writes, through `_fast_decode` and `_fast_encode`.
    """

    def __init__(self, trans: TTransportBase, *args: Any, **kwargs: Any) -> None:
        super().__init__(trans, *args, **kwargs)
        if c_codec.ENABLED:
            self._fast_decode = self._decode_struct
            self._fast_encode = self._encode_struct

    def _decode_struct(self, obj: Any, iprot: TBinaryProtocol, typeargs: list[Any]) -> Any:
        """Generated code's `_fast_decode`: read a struct of `typeargs` into `obj` (a new
        one when None, and returned), in C when the transport holds it in a small frame."""
        rest = self.trans.small_rest() if isinstance(self.trans, FramedSocketTransport) else None
        if rest is not None:
            decoded = c_codec.decode(obj, typeargs, bytes(rest), self.string_length_limit,
                                     self.container_length_limit)
            if decoded is not None:
                self.trans.consume(decoded[1])
                return decoded[0]
        self._fast_decode = None  # generated code reads it, and nested structs, in Python
        try:
            if obj is None:
                return typeargs[0].read(self)
            obj.read(self)
            return obj
        finally:
            self._fast_decode = self._decode_struct

    def _encode_struct(self, obj: Any, typeargs: list[Any]) -> bytes:
        """Generated code's `_fast_encode`: `obj` encoded in C when it is small; otherwise
        written here in Python, leaving nothing for the caller to write."""
        encoded = c_codec.encode(obj, typeargs, LARGE_WRITE_BYTES)
        if encoded is not None:
            return encoded
        self._fast_encode = None
        try:
            obj.write(self)
        finally:
            self._fast_encode = self._encode_struct
        return b""

    def readString(self) -> str:
        return str(self.readBinary(), "utf-8")

    def readBinary(self) -> memoryview:
        size = self.readI32()
        if size == BIG_BINARY:
            size = self.readI64()
        self._check_string_length(size)
        return self.trans.readAll(size)

    def writeBinary(self, buf: BytesLike) -> None:
        size = memoryview(buf).nbytes
        if size > _MAX_I32:
            self.writeI32(BIG_BINARY)
            self.writeI64(size)
            self.trans.write(buf)
            return
        super().writeBinary(buf)

    def writeMessageBegin(self, name: str, ttype: int, seqid: int) -> None:
        """As the binary protocol writes it; a call also says that its caller reads
        chunked replies (a bit stock readers ignore: see wire.chunks)."""
        if self.strictWrite and ttype == TMessageType.CALL:
            self.writeI32(TBinaryProtocol.VERSION_1 | chunks.CHUNKED_REPLIES | ttype)
            self.writeString(name)
            self.writeI32(seqid)
            return
        super().writeMessageBegin(name, ttype, seqid)

    def readUuid(self) -> uuid.UUID:
        """As the binary protocol reads it, from bytes (a UUID takes no memoryview)."""
        return uuid.UUID(bytes=bytes(self.trans.readAll(16)))

    def skip(self, ttype: int, max_depth: int = 64) -> None:
        """Skip a value, binary ones without decoding them: an unknown field a newer
        peer added may hold any bytes, and skipping it must not fail on them."""
        if ttype == TType.STRING:
            self.readBinary()
        else:
            super().skip(ttype, max_depth)


class WireProtocolFactory(TProtocolFactory):
    """Builds `WireProtocol`s whose string limit is the largest message a transport of
    these limits receives (a tensor may be as big as a chunked message)."""

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        container_length_limit: int = DEFAULT_CONTAINER_LIMIT,
        messages: MessageLimits | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.container_length_limit = container_length_limit
        self.messages = messages or MessageLimits()

    def getProtocol(self, trans: TTransportBase) -> WireProtocol:
        return WireProtocol(
            trans,
            string_length_limit=max(self.max_frame_bytes, self.messages.max_message_bytes),
            container_length_limit=self.container_length_limit,
        )


def _huge_page_buffer(size: int) -> mmap.mmap:
    """A private anonymous mapping rounded up to whole huge pages.

    Private matters: shared anonymous memory is shmem and does not get
    transparent huge pages. Memory is only committed as data arrives, so a
    peer announcing a big frame and sending nothing costs nothing.
    """
    size = -(-size // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


class MessageBuffers:
    """Where chunked messages are received: buffers shared by the process's connections,
    each reused once no tensor views it any more.

    Fresh memory costs page faults (the kernel zeroes each page) about as long as the
    transfer itself, so buffers are kept for reuse, but only up to `capacity` bytes in
    all, in use or not: beyond the tensors it holds, a process keeps at most that much,
    whatever its connections and the size of its models (bigger messages get fresh memory,
    given back when their tensors go).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kept: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A view of `size` bytes of a buffer no one else uses."""
        with self._lock:  # the view is made before another thread can test the buffer
            for buffer in sorted(self._kept, key=len):
                if len(buffer) >= size and _unreferenced(buffer):
                    return memoryview(buffer)[:size]
        fresh = _huge_page_buffer(size)
        with self._lock:
            if sum(len(b) for b in self._kept) + len(fresh) <= self.capacity:
                self._kept.append(fresh)
        return memoryview(fresh)[:size]

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._kept)


MESSAGE_BUFFERS = MessageBuffers(KEPT_MESSAGE_BYTES)


def _unreferenced(buf: mmap.mmap) -> bool:
    """True when no memoryview or array exported from `buf` is still alive.

    mmap refuses to resize while buffers are exported, even to its own size,
    which makes the resize a cheap and exact test.
    """
    try:
        buf.resize(len(buf))
    except (BufferError, OSError):
        return False
    return True


def _describe_peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "<unconnected>"
    return f"{host}:{port}"
