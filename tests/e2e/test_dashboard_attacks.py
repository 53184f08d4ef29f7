"""Hostile peers at the coordinator's dashboard port: big request bodies and headers, idle and
silent connections, over plain HTTP and HTTPS. The coordinator's memory (VmHWM) must stay
bounded, the connections be cut off in time, and the signed-in user (127.0.0.1), the Thrift
service and training be answered while the attack holds. Attackers connect from 127.0.0.2
(tests/hostile.py)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.hostile import ATTACKER, attacker_socket, hangs_up_within, peak_bytes
from tests.tls_certs import make_certs
from thrift_trainer.wire.generated import Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

TOKEN = "dashboard-attack-token"
HOST = "127.0.0.1"
MIB = 1024 * 1024
ANSWER_SECONDS = 3.0  # the signed-in user's answer, while the attack holds
CUT_OFF_SECONDS = 10.0  # the dashboard's deadline for a request to arrive whole
SLACK_SECONDS = 10.0  # on a loaded machine, for everything else


@dataclass
class Site:
    cluster: Cluster
    port: int  # the dashboard's
    tls: ssl.SSLContext | None  # the client side's, for the dashboard and the Thrift port
    flags: list[str]  # the client's

    def connection(self, source: str = HOST) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection(HOST, self.port, timeout=SLACK_SECONDS,
                                              source_address=(source, 0))
        return http.client.HTTPSConnection(HOST, self.port, timeout=SLACK_SECONDS,
                                           context=self.tls, source_address=(source, 0))

    def signed_in_get(self, path: str = "/api/runs") -> tuple[int, float]:
        """(status, seconds) of the signed-in user's request."""
        started = time.monotonic()
        connection = self.connection()
        try:
            connection.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
            response = connection.getresponse()
            response.read()
            return response.status, time.monotonic() - started
        finally:
            connection.close()

    def raw(self) -> socket.socket:
        """A connection from the attacker's address, TLS or not, sending nothing yet."""
        sock = attacker_socket(self.port)
        return sock if self.tls is None else self.tls.wrap_socket(sock, server_hostname=HOST)


def start_site(tmp_path: Path, cluster: Cluster, https: bool) -> Site:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    flags = ["--token-file", str(token)]
    serving = list(flags)
    tls = None
    if https:
        certs = make_certs(tmp_path / "certs")
        flags += ["--tls-ca", str(certs.ca)]
        serving = [*flags, "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
        tls = ssl.create_default_context(cafile=str(certs.ca))
    cluster.add_node(0.0, *serving)
    coordinator = cluster.start_coordinator(2, *serving, "--dashboard-port", "0")
    port = int(coordinator.wait_for(r"dashboard at https?://127\.0\.0\.1:(\d+)/").group(1))
    return Site(cluster, port, tls, flags)


@pytest.fixture
def site(tmp_path: Path, cluster: Cluster) -> Site:
    return start_site(tmp_path, cluster, https=False)


def thrift_answers(site: Site) -> bool:
    coordinator = site.cluster.coordinator
    with connect(Coordinator.Client, HOST, coordinator.port, token=TOKEN, tls=site.tls,
                 read_timeout=SLACK_SECONDS) as client:
        return isinstance(client.list_runs(ttypes.ListRunsRequest()).runs, list)


# ----------------------------------------------------------------- memory
def post_body(site: Site, path: str, size: int, sent: list[int]) -> None:
    """POST `size` bytes to `path` from the attacker, as fast as the server reads them."""
    chunk = bytes(MIB)
    with contextlib.suppress(OSError), site.raw() as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode())
        for _ in range(size // MIB):
            sock.sendall(chunk)
            sent.append(MIB)
        hangs_up_within(sock, SLACK_SECONDS)


def test_big_bodies_and_headers_are_refused_before_they_are_read(site: Site) -> None:
    """Three 128 MiB posts to the public login form, and a request with 1 MiB of headers."""
    before = peak_bytes(site.cluster.coordinator)
    sent: list[int] = []
    posts = [threading.Thread(target=post_body, args=(site, "/login", 128 * MIB, sent),
                              daemon=True) for _ in range(3)]
    for post in posts:
        post.start()
    with site.raw() as sock:
        sock.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * MIB + b"\r\n\r\n")
        assert hangs_up_within(sock, SLACK_SECONDS)
    status, seconds = site.signed_in_get()
    assert status == 200 and seconds < ANSWER_SECONDS
    for post in posts:
        post.join(120.0)
    grown = peak_bytes(site.cluster.coordinator) - before
    assert grown < 64 * MIB, f"the coordinator's peak grew by {grown / MIB:.0f} MiB " \
                             f"({sum(sent) / MIB:.0f} MiB sent)"
    connection = site.connection()
    connection.request("POST", "/login", body=b"x" * 5000,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert connection.getresponse().status == 413
    connection.close()


# ------------------------------------------------------------ connections
@contextlib.contextmanager
def idle_connections(site: Site, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections from the attacker that send nothing (those the server closes at
    once included); with HTTPS every other one does not even start its TLS handshake."""
    held: list[socket.socket] = []
    try:
        for number in range(count):
            with contextlib.suppress(OSError):  # refused during its handshake
                held.append(site.raw() if number % 2 else attacker_socket(site.port))
        yield held
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("https", [False, True])
def test_idle_connections_leave_the_signed_in_user_training_and_thrift_served(
        tmp_path: Path, cluster: Cluster, https: bool) -> None:
    site = start_site(tmp_path, cluster, https)
    started = time.monotonic()
    with idle_connections(site, 80) as idle:
        for _ in range(5):
            status, seconds = site.signed_in_get()
            assert status == 200 and seconds < ANSWER_SECONDS, (status, seconds)
        assert thrift_answers(site)
        trained = cluster.train_json("letters", "1", "1", "8", "0.01", *site.flags)
        assert trained["rounds"] == 1
        # the idle ones are cut off by the deadline for a request, the extra ones at once
        assert all(hangs_up_within(sock, CUT_OFF_SECONDS + SLACK_SECONDS) for sock in idle)
    assert time.monotonic() - started < CUT_OFF_SECONDS + 3 * SLACK_SECONDS + 60.0
    coordinator = cluster.coordinator
    coordinator.wait_for(rf"port {site.port} refused \d+ connection.*{ATTACKER} holds its limit")


def test_a_request_trickling_in_is_cut_off(site: Site) -> None:
    with site.raw() as sock:
        started = time.monotonic()
        cut = False
        for byte in b"GET /api/runs HTTP/1.1\r\nHost: x\r\n" * 100:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            if hangs_up_within(sock, 0.05):
                cut = True
                break
            if time.monotonic() - started > CUT_OFF_SECONDS + SLACK_SECONDS:
                break
        assert cut, "a request trickling in was not cut off"
    assert site.signed_in_get()[0] == 200
