"""Token and TLS of wire.rpc against real servers on 127.0.0.1, in this process.

Every wait is bounded: events and joins take timeouts, sockets have timeouts.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from thrift.Thrift import TApplicationException
from thrift.transport.TTransport import TTransportException

from tests.integration.test_wire_rpc import PING, EchoNode, hangs_up, work
from tests.tls_certs import Certs, make_certs
from thrift_trainer.wire import security
from thrift_trainer.wire.generated import ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.rpc import (
    ConnectionFailed,
    ConnectionPool,
    ThriftServer,
    connect,
    transport_of,
)
from thrift_trainer.wire.tensor_codec import from_wire

WAIT = 10.0  # upper bound of every wait in this file
HOST = "127.0.0.1"
TOKEN = "correct horse battery staple"
SERVICES = {"ComputeNode": ComputeNode, "Coordinator": Coordinator}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def server_tls(certs: Certs) -> ssl.SSLContext:
    return security.server_context(str(certs.cert), str(certs.key))


@pytest.fixture(scope="module")
def client_tls(certs: Certs) -> ssl.SSLContext:
    return security.client_context(str(certs.ca))


class Serving:
    """Servers started by a test, stopped (and their threads joined) after it."""

    def __init__(self) -> None:
        self.started: list[tuple[ThriftServer, threading.Thread]] = []

    def __call__(self, processor: Any, **kwargs: Any) -> ThriftServer:
        server = ThriftServer(processor, HOST, 0, **kwargs)
        self.started.append((server, server.serve_in_thread()))
        return server

    def stop_all(self) -> None:
        for server, thread in self.started:
            server.stop()
            thread.join(WAIT)
            assert not thread.is_alive(), "serve_forever did not return after stop()"


@pytest.fixture
def serve() -> Iterator[Serving]:
    serving = Serving()
    yield serving
    serving.stop_all()


@pytest.fixture
def default_security() -> Iterator[None]:
    """Lets a test call security.configure; the process default is restored afterwards."""
    before = security.current()
    yield
    security.configure(before)


class Recorder:
    """A handler for either service that records every call reaching it and answers nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(request: Any) -> None:
            self.calls.append(name)  # no result: the client raises MISSING_RESULT

        return method


class LogWatch(logging.Handler):
    """Sets `seen` when a record matching `pattern` is logged, from any thread."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.pattern.search(record.getMessage()):
            self.seen.set()


@pytest.fixture
def watch_log() -> Iterator[Any]:
    watches: list[LogWatch] = []
    root = logging.getLogger()

    def start(pattern: str) -> LogWatch:
        watch = LogWatch(pattern)
        root.addHandler(watch)
        watches.append(watch)
        return watch

    yield start
    for watch in watches:
        root.removeHandler(watch)


def request_type(service: Any, method: str) -> type:
    return getattr(service, f"{method}_args").thrift_spec[1][3][0]


# ------------------------------------------------------------------ tokens
@pytest.mark.parametrize("service_name", sorted(SERVICES))
@pytest.mark.parametrize("token, refusal", [(None, "carried none"), ("wrong", "does not match")])
def test_every_method_of_both_services_refuses_a_bad_token_over_the_wire(
    serve: Serving, service_name: str, token: str | None, refusal: str
) -> None:
    service, handler = SERVICES[service_name], Recorder()
    server = serve(service.Processor(handler), token=TOKEN)
    methods = sorted(service.Processor(None)._processMap)
    with connect(service.Client, HOST, server.port, token=token, read_timeout=WAIT) as client:
        for method in methods:
            with pytest.raises(ttypes.Unauthorized, match=refusal):
                getattr(client, method)(request_type(service, method)())
    assert handler.calls == []
    with connect(service.Client, HOST, server.port, token=TOKEN, read_timeout=WAIT) as client:
        for method in methods:  # the right token reaches the handler
            with pytest.raises(TApplicationException) as info:
                getattr(client, method)(request_type(service, method)())
            assert info.value.type == TApplicationException.MISSING_RESULT
    assert handler.calls == methods


def test_servers_with_different_tokens_in_one_process(serve: Serving) -> None:
    first = serve(ComputeNode.Processor(EchoNode()), token="first")
    second = serve(ComputeNode.Processor(EchoNode()), token="second")
    with connect(ComputeNode.Client, HOST, first.port, token="first") as c:
        assert c.ping(PING).node_id == "echo"
        with pytest.raises(ttypes.Unauthorized):
            c.ping(ttypes.PingRequest(protocol_version=PING.protocol_version, token="second"))
    with connect(ComputeNode.Client, HOST, second.port, token="second") as c:
        assert c.ping(PING).node_id == "echo"
    pool = ConnectionPool(ComputeNode.Client, HOST, second.port, token="first")
    with pytest.raises(ttypes.Unauthorized), pool.client() as c:
        c.ping(PING)
    pool.close()


def test_the_process_default_reaches_every_server_and_connection(
    serve: Serving, default_security: None
) -> None:
    security.configure(security.Security(token=TOKEN))
    server = serve(ComputeNode.Processor(EchoNode()))  # requires the default token
    with connect(ComputeNode.Client, HOST, server.port) as c:
        assert c.ping(PING).node_id == "echo"
    pool = ConnectionPool(ComputeNode.Client, HOST, server.port, read_timeout=WAIT)
    with pool.client() as c:
        assert c.ping(PING).node_id == "echo"
    pool.close()
    with connect(ComputeNode.Client, HOST, server.port, token="explicit wins") as c, \
            pytest.raises(ttypes.Unauthorized):
        c.ping(PING)


# --------------------------------------------------------------------- TLS
def test_tls_carries_big_tensors_bit_exact_with_a_token(
    serve: Serving, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), token=TOKEN, tls=server_tls)
    rng = np.random.default_rng(3)
    sent = {"big": rng.standard_normal(5 * 1024 * 1024).astype(np.float32),  # 20 MiB
            "small": np.arange(7, dtype=np.int64)}
    with connect(ComputeNode.Client, HOST, server.port, token=TOKEN, tls=client_tls,
                 read_timeout=WAIT) as c:
        assert isinstance(transport_of(c)._sock, ssl.SSLSocket)
        update = c.train_with_weights(work(**sent)).update
        assert c.ping(PING).node_id == "echo"  # the connection stays in step
    got = {t.name: from_wire(t) for t in update}
    for name, array in sent.items():
        assert np.array_equal(got[name], array)


def test_a_pool_connects_over_tls(
    serve: Serving, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), tls=server_tls)
    pool = ConnectionPool(ComputeNode.Client, HOST, server.port, tls=client_tls,
                          read_timeout=WAIT)
    for _ in range(3):
        with pool.client() as c:
            assert c.ping(PING).node_id == "echo"
    pool.close()


def test_a_plaintext_client_is_refused_and_others_are_served(
    serve: Serving, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext, watch_log: Any
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), tls=server_tls)
    refused = watch_log("does not speak TLS")
    with connect(ComputeNode.Client, HOST, server.port, read_timeout=WAIT) as plain, \
            pytest.raises(TApplicationException, match="only TLS connections.*--tls-ca"):
        plain.ping(PING)
    assert refused.seen.wait(WAIT)
    with connect(ComputeNode.Client, HOST, server.port, tls=client_tls) as c:
        assert c.ping(PING).node_id == "echo"


def test_a_tls_client_of_a_plaintext_server_fails_fast_and_the_server_says_why(
    serve: Serving, client_tls: ssl.SSLContext, watch_log: Any
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()))
    told = watch_log("speaks TLS to a plaintext connection")
    start = time.monotonic()
    with pytest.raises(ConnectionFailed, match="TLS handshake failed"), \
            connect(ComputeNode.Client, HOST, server.port, tls=client_tls, connect_timeout=WAIT):
        pass
    assert time.monotonic() - start < WAIT / 2  # the server hangs up; no timeout is needed
    assert told.seen.wait(WAIT)


def test_a_certificate_from_another_ca_is_not_trusted(
    serve: Serving, server_tls: ssl.SSLContext, certs: Certs
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), tls=server_tls)
    stranger = security.client_context(str(certs.other_ca))
    with pytest.raises(ConnectionFailed, match="not trusted.*--tls-ca"), \
            connect(ComputeNode.Client, HOST, server.port, tls=stranger):
        pass


def test_a_certificate_must_name_the_address_dialled(
    serve: Serving, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), tls=server_tls)
    if socket.gethostbyname("localhost") != HOST:
        pytest.fail("this test needs 'localhost' to resolve to 127.0.0.1")
    with pytest.raises(ConnectionFailed, match="name localhost"), \
            connect(ComputeNode.Client, "localhost", server.port, tls=client_tls):
        pass  # the certificate names IP 127.0.0.1 only


def test_a_silent_client_is_cut_off_after_the_handshake_timeout(
    serve: Serving, server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    server = serve(ComputeNode.Processor(EchoNode()), tls=server_tls, handshake_timeout=0.3)
    start = time.monotonic()
    with socket.create_connection((HOST, server.port), timeout=WAIT) as silent:
        assert hangs_up(silent)
    assert time.monotonic() - start < WAIT / 2
    with connect(ComputeNode.Client, HOST, server.port, tls=client_tls) as c:
        assert c.ping(PING).node_id == "echo"


def test_stop_drains_and_closes_tls_connections(
    server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> None:
    node = EchoNode()
    server = ThriftServer(ComputeNode.Processor(node), HOST, 0, tls=server_tls)
    thread = server.serve_in_thread()
    answers: list[ttypes.TrainResult] = []

    def slow_call() -> None:
        with connect(ComputeNode.Client, HOST, server.port, tls=client_tls,
                     read_timeout=WAIT) as c:
            answers.append(c.train_with_weights(work("wait")))

    caller = threading.Thread(target=slow_call, daemon=True)
    caller.start()
    with connect(ComputeNode.Client, HOST, server.port, tls=client_tls, read_timeout=WAIT) as idle:
        assert idle.ping(PING).node_id == "echo"
        assert node.entered.wait(WAIT)
        server.stop()
        node.release.set()  # the call in progress may still answer, encrypted
        caller.join(WAIT)
        thread.join(WAIT)
        assert not thread.is_alive()
        assert len(answers) == 1 and answers[0].accepted
        with pytest.raises(TTransportException):
            idle.ping(PING)
