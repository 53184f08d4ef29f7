"""Answering a client that speaks another protocol than the server: a plaintext client
that dialled a TLS-only server, or an HTTP client (a browser, curl) on a Thrift port.

The server cannot serve such a client, but it can tell it why, in the client's own
protocol: an HTTP client gets a plain-text HTTP answer; a plaintext Thrift client gets
its first call answered with a Thrift exception naming the fix. Clients route a reply by its method
name and sequence id (Node.js drops a reply whose name matches no call it made, and
Java checks the sequence id), so the refusal echoes both from the head of the client's
first frame. Only that head is read, a few hundred bytes at most, under the server's
handshake deadline; a frame that is not a Thrift call (or arrives too slowly) is answered
with an empty name and sequence id 0, which Python clients read all the same.
"""

from __future__ import annotations

import socket
import struct
import time
from contextlib import suppress

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType
from thrift.transport.TTransport import TMemoryBuffer

from thrift_trainer.wire import frame_scan

MESSAGE = ("this server accepts only TLS connections; give the connecting side --tls-ca with "
           "the CA that signed the server's certificate")
MAX_METHOD_NAME = 128  # longer names are not echoed: no method of the IDL comes close
# A strict binary message opens with version and type, name length, name, sequence id.
HEAD_BYTES = 4 + 4 + MAX_METHOD_NAME + 4
_FRAME_SIZE = struct.Struct("!i")
_DRAIN_CHUNKS = 16  # of 64 KiB: a plaintext client's first request, read and dropped
# A TLS connection opens with a handshake record, whose first byte is 22.
_TLS_HANDSHAKE_RECORD = 0x16
HTTP_ANSWER = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n"
               b"Connection: close\r\n\r\n"
               b"This port speaks Thrift, not HTTP: it is a trainer's RPC port. The "
               b"coordinator's dashboard has a port of its own (--dashboard-port).\n")


def speaks_plaintext(sock: socket.socket) -> bool:
    """Whether the peer's first byte (peeked, left unread) cannot start a TLS handshake."""
    first = sock.recv(1, socket.MSG_PEEK)
    return bool(first) and first[0] != _TLS_HANDSHAKE_RECORD


def refuse(sock: socket.socket, max_frame_bytes: int, seconds: float) -> None:
    """Answer the plaintext client's first call on `sock` with the refusal; the head of
    its first frame is read within `seconds` (see `answer` for the rest)."""
    with suppress(OSError):
        method, seqid = _first_call(sock, max_frame_bytes, time.monotonic() + seconds)
        answer(sock, refusal(method, seqid), seconds)


def answer(sock: socket.socket, reply: bytes, seconds: float) -> None:
    """Send `reply`, then read and drop what the client sent (bounded, waiting at most
    `seconds` at a time) until it hangs up: closing with unread data would reset the
    connection, and the client could lose the answer before reading it."""
    with suppress(OSError):
        sock.sendall(reply)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(seconds)  # the client's hang-up may take a while on a loaded machine
        for _ in range(_DRAIN_CHUNKS):
            if not sock.recv(64 * 1024):
                break


def refusal(method: str = "", seqid: int = 0) -> bytes:
    """One framed Thrift exception message answering call `seqid` of `method`."""
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, TMessageType.EXCEPTION, seqid)
    TApplicationException(TApplicationException.UNKNOWN, MESSAGE).write(protocol)
    protocol.writeMessageEnd()
    message = buffer.getvalue()
    return _FRAME_SIZE.pack(len(message)) + message


def _first_call(sock: socket.socket, max_frame_bytes: int, deadline: float) -> tuple[str, int]:
    """Method name and sequence id of the first framed call, or ("", 0) when there is none."""
    size_field = _read(sock, _FRAME_SIZE.size, deadline)
    if len(size_field) < _FRAME_SIZE.size:
        return "", 0
    size = _FRAME_SIZE.unpack(size_field)[0]
    if not 0 < size <= max_frame_bytes:
        return "", 0
    head = _read(sock, min(size, HEAD_BYTES), deadline)
    try:
        method, message_type, seqid = frame_scan.message_head(memoryview(head))
    except frame_scan.ScanError:
        return "", 0
    if message_type != TMessageType.CALL or len(method) > MAX_METHOD_NAME:
        return "", 0
    return method, seqid


def _read(sock: socket.socket, count: int, deadline: float) -> bytes:
    """Up to `count` bytes: fewer when the peer hangs up, stops sending, or time runs out."""
    data = bytearray()
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(count - len(data))
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)
