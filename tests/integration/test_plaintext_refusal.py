"""A TLS-only server answers a plaintext client's first call with a refusal it can route.

Raw sockets on 127.0.0.1 against a real server in this process: the refusal must carry
the method name and sequence id of the call it answers (clients other than Python's
match replies by them), and fall back to an empty name and id 0 for anything else.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType
from thrift.transport.TTransport import TMemoryBuffer

from tests.tls_certs import make_certs
from thrift_trainer.wire import plaintext_refusal, security
from thrift_trainer.wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from thrift_trainer.wire.rpc import ThriftServer

HOST = "127.0.0.1"
WAIT = 10.0
HANDSHAKE = 1.0  # the server's deadline for the head of a plaintext call


class Unreachable(Coordinator.Iface):
    """A handler no plaintext call may reach."""

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        raise AssertionError("a plaintext call reached the handler of a TLS-only server")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThriftServer]:
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    tls = security.server_context(str(certs.cert), str(certs.key))
    server = ThriftServer(Coordinator.Processor(Unreachable()), HOST, 0, tls=tls,
                          handshake_timeout=HANDSHAKE, max_frame_bytes=1 << 20)
    thread = server.serve_in_thread()
    yield server
    server.stop()
    thread.join(WAIT)


def call_frame(method: str, seqid: int, message_type: int = TMessageType.CALL) -> bytes:
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, message_type, seqid)
    Coordinator.ping_args(request=ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)) \
        .write(protocol)
    protocol.writeMessageEnd()
    body = buffer.getvalue()
    return struct.pack("!i", len(body)) + body


def answer(server: ThriftServer, *sent: bytes) -> tuple[str, int, int, str]:
    """Send `sent` in separate writes on a plaintext connection; the reply's
    method name, message type, sequence id and exception message."""
    with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
        for chunk in sent:
            sock.sendall(chunk)
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    size = struct.unpack_from("!i", reply)[0]
    assert size == len(reply) - 4, "the reply is exactly one frame"
    protocol = TBinaryProtocol(TMemoryBuffer(bytes(reply[4:])))
    method, message_type, seqid = protocol.readMessageBegin()
    error = TApplicationException()
    error.read(protocol)
    return method, message_type, seqid, error.message


def test_the_refusal_answers_the_call_by_its_name_and_sequence_id(server: ThriftServer) -> None:
    method, message_type, seqid, message = answer(server, call_frame("train", 7))
    assert (method, message_type, seqid) == ("train", TMessageType.EXCEPTION, 7)
    assert message == plaintext_refusal.MESSAGE
    assert "--tls-ca" in message


def test_a_call_whose_head_arrives_in_pieces_is_answered_by_name(server: ThriftServer) -> None:
    frame = call_frame("ping", 2**31 - 1)
    assert answer(server, frame[:3], frame[3:9], frame[9:])[:3] == \
        ("ping", TMessageType.EXCEPTION, 2**31 - 1)


@pytest.mark.parametrize("sent", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not Thrift: the frame size is absurd
    struct.pack("!i", (1 << 20) + 1) + b"\x80\x01\x00\x01",  # over the server's frame limit
    call_frame("ping", 5, TMessageType.ONEWAY),  # nothing to answer by name
    struct.pack("!i", 300) + struct.pack("!ii", -0x7FFEFFFF, 200) + b"x" * 200,  # long name
], ids=["http", "oversized", "oneway", "long-name"])
def test_anything_else_gets_the_anonymous_refusal(server: ThriftServer, sent: bytes) -> None:
    assert answer(server, sent) == ("", TMessageType.EXCEPTION, 0, plaintext_refusal.MESSAGE)


def test_a_client_that_stops_mid_head_is_refused_at_the_deadline(server: ThriftServer) -> None:
    start = time.monotonic()
    with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
        sock.sendall(call_frame("ping", 3)[:6])
        reply = sock.recv(65536)
        waited = time.monotonic() - start
    assert reply == plaintext_refusal.refusal()
    assert HANDSHAKE * 0.9 <= waited < WAIT / 2
