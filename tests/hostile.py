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

from devtools.local_cluster import Proc
from wire.transport import FramedSocketTransport, WireProtocolFactory

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
