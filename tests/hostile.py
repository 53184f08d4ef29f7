"""What the hostile-peer tests share: an attacker's address, its connections and calls, and
the memory of the server process under attack.

Attackers connect from 127.0.0.2, so that a server tells them apart from the legitimate
callers on 127.0.0.1 (per-address limits count them separately); both are this machine.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TMessageType
from thrift.transport.TTransport import TMemoryBuffer

from devtools.local_cluster import Proc
from thrift_trainer.wire import chunks
from thrift_trainer.wire.transport import FramedSocketTransport, WireProtocolFactory

ATTACKER = "127.0.0.2"
HOST = "127.0.0.1"


def attacker_socket(port: int, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:port from the attacker's address."""
    return socket.create_connection((HOST, port), timeout=timeout, source_address=(ATTACKER, 0))


class AttackerClient:
    """A generated Thrift client (`service.Client`) on a connection from the attacker's
    address; a context manager that closes it."""

    def __init__(self, service: Any, port: int, timeout: float = 30.0) -> None:
        self._transport = FramedSocketTransport(attacker_socket(port, timeout))
        self.client = service.Client(WireProtocolFactory().getProtocol(self._transport))

    def __enter__(self) -> Any:
        return self.client

    def __exit__(self, *exc_info: object) -> None:
        self._transport.close()


def memory_kib(proc: Proc) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident) of a process, in KiB."""
    status = Path(f"/proc/{proc.popen.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def resident_bytes(proc: Proc) -> int:
    return memory_kib(proc)["VmRSS"] * 1024


def peak_bytes(proc: Proc) -> int:
    return memory_kib(proc)["VmHWM"] * 1024


def frame_header(size: int) -> bytes:
    """The 4 bytes that announce a framed Thrift message of `size` bytes."""
    return struct.pack("!i", size)


def hangs_up_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds`, reading whatever it sends."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


# ------------------------------------------------------------ the chunk protocol
def chunked_call(method: str, args: Any, chunk: int, token: str | None = None
                 ) -> tuple[bytes, list[bytes]]:
    """A call of `method` (its generated `<method>_args`) as the announcement and the DATA
    frames of the chunk protocol, ready to be sent whole, reordered or cut short."""
    buffer = TMemoryBuffer()
    protocol = TBinaryProtocol(buffer)
    protocol.writeMessageBegin(method, TMessageType.CALL, 1)
    args.write(protocol)
    protocol.writeMessageEnd()
    message = buffer.getvalue()
    total = len(message)
    frames = [chunks.data_header(seq, total, len(part)) + part
              for seq, part in enumerate((message[i:i + chunk]
                                          for i in range(0, total, chunk)), 1)]
    return chunks.announce(total, chunk, token), frames


def answer_to_announcement(sock: socket.socket, chunk: int) -> str | None:
    """None if the server accepted the announcement just sent on `sock` with chunks of
    `chunk` bytes (as announced), else the reason it gave."""
    (word,) = struct.unpack("!I", recv_exactly(sock, 4))
    assert word & chunks.CHUNK_FLAG, "the answer is not a frame of the chunk protocol"
    answer = chunks.parse_answer(recv_exactly(sock, word & chunks.LENGTH_MASK), "the server",
                                 chunk)
    assert answer.refused is not None or answer.chunk == chunk, answer
    return answer.refused


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes from `sock`; the test fails if the server hangs up first."""
    data = b""
    while len(data) < size:
        part = sock.recv(size - len(data))
        assert part, "the server hung up instead of answering"
        data += part
    return data


def _ordinary_frame_instead(frames: list[bytes]) -> bytes:
    return frames[0] + struct.pack("!i", 4) + b"ping"


def _wrong_total(frames: list[bytes]) -> bytes:
    second = bytearray(frames[1])
    struct.pack_into("!Q", second, 9, 10 * 2**20)  # the total in chunk 2's head
    return frames[0] + bytes(second)


def _short_chunk(frames: list[bytes]) -> bytes:
    (word,) = struct.unpack_from("!I", frames[1])
    return frames[0] + struct.pack("!I", word - 10) + frames[1][4:-10]


# Broken sequences of the DATA frames of a chunked call (after its accepted announcement):
# a server must drop the message whole and close the connection.
BROKEN_SEQUENCES = {
    "out of order": lambda frames: frames[1] + frames[0],
    "duplicated": lambda frames: frames[0] + frames[0],
    "missing": lambda frames: frames[0] + frames[2],
    "ordinary frame instead": _ordinary_frame_instead,
    "wrong total": _wrong_total,
    "short chunk": _short_chunk,
    "cut mid-chunk": lambda frames: frames[0] + frames[1][:5000],
}


LYING_ELEMENTS = 1 << 40  # float64 entries a lying array header claims: 8 TiB


def lie_about_size(path: Path, member: str) -> None:
    """Rewrite the .npz at ``path`` with array ``member``'s .npy header claiming
    LYING_ELEMENTS float64 entries, followed by 8 bytes of data: a file of about 1 KiB that
    a reader trusting the header would try to allocate 8 TiB for."""
    import io
    import zipfile

    from numpy.lib import format as npy

    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    header = io.BytesIO()
    npy.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                        "shape": (LYING_ELEMENTS,)})
    members[f"{member}.npy"] = header.getvalue() + bytes(8)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
