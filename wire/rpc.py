"""Clients and a threaded server for the generated Thrift services.

Everything here speaks `wire.transport`'s framed transport with the
pure-Python binary protocol, with timeouts on connecting and reading, so a dead
peer turns into an exception instead of a hung thread. What a call can raise, and the
one place that maps it, is `wire.errors`.

Generated clients are not thread-safe: one call at a time per connection. Use
one `connect()` per thread, or a `ConnectionPool`, which hands each caller its
own connection.

Token, TLS and frame limit: each constructor takes them as arguments; left as None
they come from `wire.security.current()`, which the commands set from their flags.
"""

from __future__ import annotations

import logging
import select
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Generic, TypeVar

from thrift.protocol.TProtocol import TProtocolBase
from thrift.Thrift import TProcessor
from thrift.transport.TTransport import TTransportException

from thrift_trainer.wire import auth, plaintext_refusal, security
from thrift_trainer.wire.chunks import MessageLimits
from thrift_trainer.wire.errors import ConnectionFailed
from thrift_trainer.wire.handler_errors import releasing_processor
from thrift_trainer.wire.limits import ConnectionSlots, FrameBudget, RefusalLog, ServerLimits
from thrift_trainer.wire.transport import (
    FramedSocketTransport,
    IdleTimeout,
    ServerReads,
    WireProtocolFactory,
    WrongProtocol,
    tune_socket,
)

log = logging.getLogger(__name__)

C = TypeVar("C")
ClientFactory = Callable[[TProtocolBase], C]


DRAIN_SECONDS = 5.0  # on stop, how long calls in progress may take to answer
HANDSHAKE_SECONDS = 10.0  # longest TLS handshake a server waits for, per connection
ACCEPT_BACKOFF_SECONDS = 0.2  # pause after a failed accept (out of descriptors): no spinning


def open_transport(
    host: str,
    port: int,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float | None = 60.0,
    max_frame_bytes: int | None = None,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
    messages: MessageLimits | None = None,
) -> FramedSocketTransport:
    """Connect to host:port and return an open transport, or raise ConnectionFailed.

    With `tls` (default: the process's client context, if any) the connection is
    TLS and the server's certificate must be signed by its CA and name `host`;
    the handshake is bounded by `connect_timeout`. `token` goes with announcements of
    chunked messages (the requests carry it too); `messages` default to the process's.
    """
    where = f"{host}:{port}"
    defaults = security.current()
    tls = tls or defaults.client_tls
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except socket.gaierror as exc:
        raise ConnectionFailed(f"cannot connect to {where}: name not resolved ({exc})") from exc
    except TimeoutError as exc:
        raise ConnectionFailed(
            f"cannot connect to {where}: timed out after {connect_timeout}s "
            "(host down or a firewall dropping packets?)"
        ) from exc
    except ConnectionRefusedError as exc:
        raise ConnectionFailed(
            f"cannot connect to {where}: connection refused (is the server running on that port?)"
        ) from exc
    except OSError as exc:
        raise ConnectionFailed(f"cannot connect to {where}: {exc}") from exc
    tune_socket(sock)
    if tls is not None:
        sock = _start_client_tls(sock, tls, host, where)
    sock.settimeout(read_timeout)
    return FramedSocketTransport(
        sock, max_frame_bytes=max_frame_bytes or defaults.max_frame_bytes, peer=where,
        token=token or defaults.token, messages=messages or defaults.messages,
    )


def _start_client_tls(
    sock: socket.socket, tls: ssl.SSLContext, host: str, where: str
) -> ssl.SSLSocket:
    """Handshake on `sock` (under its connect timeout), or close it and raise ConnectionFailed."""
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ConnectionFailed(
            f"cannot connect to {where}: its TLS certificate is not trusted "
            f"({exc.verify_message}); --tls-ca must hold the CA that signed it and the "
            f"certificate must name {host} in its subjectAltName"
        ) from exc
    except OSError as exc:  # ssl.SSLError, a reset or a timeout during the handshake
        sock.close()
        raise ConnectionFailed(
            f"cannot connect to {where}: TLS handshake failed ({exc}); is the server started "
            "with --tls-cert and --tls-key?"
        ) from exc


class connect(Generic[C]):  # noqa: N801 - used like a function: `with connect(...) as c`
    """Context manager yielding a connected `client_cls` (e.g. `ComputeNode.Client`).

    `read_timeout` bounds each send or receive making no progress; change it
    on the open connection with `set_read_timeout`. A class rather than a
    generator-based context manager on purpose: contextlib re-raises by
    assigning `__traceback__`, which Thrift's immutable exception classes refuse.
    """

    def __init__(
        self,
        client_cls: ClientFactory[C],
        host: str,
        port: int,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float | None = 60.0,
        max_frame_bytes: int | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        messages: MessageLimits | None = None,
    ) -> None:
        self._transport = open_transport(
            host,
            port,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_frame_bytes=max_frame_bytes,
            tls=tls,
            token=token,
            messages=messages,
        )
        protocols = WireProtocolFactory(self._transport.max_frame_bytes,
                                        messages=self._transport.messages)
        self._client = _with_token(client_cls(protocols.getProtocol(self._transport)), token)

    def __enter__(self) -> C:
        return self._client

    def __exit__(self, *exc_info: object) -> None:
        self._transport.close()


def _with_token(client: C, token: str | None) -> C:
    """`client` sending `token` (default: the process's) with every request, if there is one."""
    token = token or security.current().token
    return auth.TokenClient(client, token) if token else client  # type: ignore[return-value]


def set_read_timeout(client: Any, seconds: float | None) -> None:
    """Change the read timeout of a client made by `connect` or a `ConnectionPool`.

    Useful to wait long for a training call but briefly for a ping on the same
    connection. None waits forever.
    """
    transport_of(client).set_timeout(seconds)


def transport_of(client: Any) -> FramedSocketTransport:
    """The transport under a generated client (they keep their protocol in `_iprot`)."""
    transport = getattr(getattr(auth.unwrap(client), "_iprot", None), "trans", None)
    if not isinstance(transport, FramedSocketTransport):
        raise TypeError(f"{client!r} was not made by wire.rpc.connect or a ConnectionPool")
    return transport


class ConnectionPool(Generic[C]):
    """Thread-safe pool of connections to one server.

    `with pool.client() as c:` lends a connection for the block: an idle one
    if there is one, otherwise a new one. A connection whose block raised
    anything is closed, not returned, so a broken socket is never reused.
    Each borrowed client starts with the pool's read timeout.

    Servers close connections idle for their idle timeout, so an idle connection
    is only lent if it has been idle for less than `max_idle_seconds` (default:
    half the process's idle timeout) and the server has not closed it; otherwise it
    is closed and the next one, or a new one, is used instead.
    """

    def __init__(
        self,
        client_cls: ClientFactory[C],
        host: str,
        port: int,
        *,
        max_idle: int = 8,
        connect_timeout: float = 5.0,
        read_timeout: float | None = 60.0,
        max_frame_bytes: int | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        max_idle_seconds: float | None = None,
        messages: MessageLimits | None = None,
    ) -> None:
        defaults = security.current()  # settled now, so every connection of the pool agrees
        self._client_cls = client_cls
        self.host, self.port = host, port
        self._max_idle = max_idle
        server_idle = defaults.limits.idle_timeout
        self._max_idle_seconds = max_idle_seconds or (server_idle / 2 if server_idle else None)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._protocols = WireProtocolFactory(max_frame_bytes or defaults.max_frame_bytes,
                                              messages=messages or defaults.messages)
        self._token = token or defaults.token
        self._tls = tls or defaults.client_tls
        self._idle: list[tuple[C, float]] = []  # with the time each came back
        self._lock = threading.Lock()
        self._closed = False

    def client(self) -> _Lease[C]:
        """Lend a connected client for the duration of the with-block."""
        return _Lease(self)

    def close(self) -> None:
        """Close idle connections; lent ones are closed when they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for client, _ in idle:
            transport_of(client).close()

    def discard_idle(self) -> None:
        """Close the idle connections but stay usable: after the server failed (it may
        have restarted), old connections would only fail on their next use."""
        with self._lock:
            idle, self._idle = self._idle, []
        for client, _ in idle:
            transport_of(client).close()

    def _checkout(self) -> C:
        client = self._usable_idle()
        if client is None:
            transport = open_transport(
                self.host,
                self.port,
                connect_timeout=self._connect_timeout,
                max_frame_bytes=self._protocols.max_frame_bytes,
                tls=self._tls,
                token=self._token,
                messages=self._protocols.messages,
            )
            client = _with_token(self._client_cls(self._protocols.getProtocol(transport)),
                                 self._token)
        set_read_timeout(client, self._read_timeout)
        return client

    def _usable_idle(self) -> C | None:
        """The most recently returned idle connection still fit to use; unfit ones closed."""
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"connection pool for {self.host}:{self.port} is closed")
                if not self._idle:
                    return None
                client, since = self._idle.pop()
            transport = transport_of(client)
            too_old = (self._max_idle_seconds is not None
                       and time.monotonic() - since > self._max_idle_seconds)
            if not too_old and not transport.peer_closed():
                return client
            transport.close()

    def _checkin(self, client: C) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append((client, time.monotonic()))
                return
        transport_of(client).close()


class _Lease(Generic[C]):
    """One borrowed connection: returned to the pool on success, closed on any error."""

    def __init__(self, pool: ConnectionPool[C]) -> None:
        self._pool = pool
        self._client: C | None = None

    def __enter__(self) -> C:
        self._client = self._pool._checkout()
        return self._client

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self._pool._checkin(self._client)
        else:
            transport_of(self._client).close()


class ThriftServer:
    """Threaded server: accepts in `serve_forever`, one daemon thread per connection.

    A busy handler only blocks its own connection. A client that sends garbage
    or an oversized frame loses its connection; the server keeps serving.
    `stop()` may be called from any thread or a signal handler.

    With a `token` every call must carry it (else the declared Unauthorized,
    answered before the call is decoded); with `tls` every connection must
    complete a TLS handshake within `handshake_timeout`. `limits` (see
    `wire.limits`) caps connections, in all and per address, and bounds how long
    a request may take to start and to arrive and the memory of unfinished frames;
    `messages` sets the chunk size of its replies and the largest request it takes.
    All, and `max_frame_bytes`, default to the process's `wire.security` settings.
    """

    def __init__(
        self,
        processor: TProcessor,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int | None = None,
        limits: ServerLimits | None = None,
        backlog: int = 128,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = HANDSHAKE_SECONDS,
        messages: MessageLimits | None = None,
    ) -> None:
        defaults = security.current()
        token = token or defaults.token
        guarded = auth.guard_processor(processor, token) if token else processor
        self._processor, self._handler = releasing_processor(guarded)
        self._gate = auth.RequestGate(processor, token) if token else None
        self._token = token
        self._protocols = WireProtocolFactory(max_frame_bytes or defaults.max_frame_bytes,
                                              messages=messages or defaults.messages)
        self._tls = tls or defaults.server_tls
        self._handshake_timeout = handshake_timeout
        self.limits = limits = limits or defaults.limits
        # One address's unfinished frames claim at most one frame of the largest size:
        # peers announcing big frames from one address cannot starve callers at others.
        budget = FrameBudget(limits.pending_frame_bytes, per_peer=self._protocols.max_frame_bytes)
        self._reads = ServerReads(limits.idle_timeout, limits.frame_timeout, budget,
                                  keep_buffers=not token)
        self._slots = ConnectionSlots(limits.max_connections, limits.max_connections_per_peer)
        self._listener = socket.create_server((host, port), backlog=backlog)  # SO_REUSEADDR
        self._listener.setblocking(False)
        self.host: str = host
        self.port: int = self._listener.getsockname()[1]
        self._refusals = RefusalLog(self.port)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)  # notified as connections close
        self._stop_requested = False

    def serve_forever(self) -> None:
        """Accept connections until `stop()`; then close the listener and connections.

        Returns at once (closing everything) if `stop()` came first.
        """
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop_requested:
                for key, _ in selector.select():
                    if key.fileobj is self._listener and not self._stop_requested:
                        self._accept()
        finally:
            selector.close()
            self._close_all()

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed."""
        with self._lock:
            return len(self._connections)

    @property
    def frame_budget(self) -> FrameBudget:
        """What frames of unauthenticated peers still arriving claim (see wire.limits)."""
        return self._reads.budget

    def serve_in_thread(self) -> threading.Thread:
        """Run `serve_forever` in a started daemon thread and return the thread."""
        thread = threading.Thread(
            target=self.serve_forever, name=f"thrift-server-{self.port}", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        """Make `serve_forever` return promptly; safe from threads and signal handlers.

        Takes no lock (a signal handler may interrupt the thread holding one):
        it only raises a flag and wakes the accept loop, which closes the
        listener and every open connection on its way out.
        """
        self._stop_requested = True
        with suppress(OSError):  # already woken, or already closed
            self._wake_w.send(b"x")

    def _accept(self) -> None:
        try:
            sock, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. out of file descriptors: keep serving the others
            self._refusals.refused(f"accept failed: {exc}")
            self._pause_accepting()
            return
        refused = self._slots.acquire(address[0])
        if refused is not None:
            sock.close()
            self._refusals.refused(refused)
            return
        peer = f"{address[0]}:{address[1]}"
        tune_socket(sock)
        with self._lock:
            self._connections.add(sock)
        threading.Thread(
            target=self._serve_connection, args=(sock, peer, address[0]), name=f"thrift-{peer}",
            daemon=True,
        ).start()

    def _pause_accepting(self) -> None:
        """Wait a moment (or until stopped): the listener stays readable while accept
        fails, and retrying at once would spin a core."""
        with suppress(OSError, ValueError):  # the wake socket closed: stopping anyway
            select.select([self._wake_r], [], [], ACCEPT_BACKOFF_SECONDS)

    def _serve_connection(self, sock: socket.socket, peer: str, host: str) -> None:
        try:
            self._serve(sock, peer, host)
        finally:
            self._slots.release(host)

    def _serve(self, sock: socket.socket, peer: str, host: str) -> None:
        if self._tls is not None:
            secured = self._start_server_tls(sock, peer)
            if secured is None:
                return
            sock = secured
        transport = FramedSocketTransport(
            sock, max_frame_bytes=self._protocols.max_frame_bytes, peer=peer,
            server_reads=self._reads, peer_host=host, messages=self._protocols.messages,
            required_token=self._token,
        )
        protocol = self._protocols.getProtocol(transport)
        try:
            while not self._stop_requested:
                if self._gate is None or self._gate.admit(transport, protocol):
                    self._processor.process(protocol, protocol)
                    self._handler.release()  # answered: what it raised holds the request
        except WrongProtocol as exc:  # a peer at the wrong port: told in its protocol
            log.warning("closing %s: %s", peer, exc)
            if exc.protocol == "HTTP":
                plaintext_refusal.answer(sock, plaintext_refusal.HTTP_ANSWER,
                                         self._handshake_timeout)
        except TTransportException as exc:
            log.log(_level_of(exc), "closing %s: %s", peer, exc)
        except Exception as exc:  # a bad client must never take the server down
            log.warning("closing %s after a bad request: %r", peer, exc)
        finally:
            transport.close()
            self._forget(sock)

    def _start_server_tls(self, sock: socket.socket, peer: str) -> ssl.SSLSocket | None:
        """The TLS connection over `sock`, or None (closed, logged) if the handshake failed.

        Done on the connection's own thread, so a slow or silent peer delays no
        one else, and bounded by `handshake_timeout` so it cannot hold the thread.
        """
        assert self._tls is not None
        current: socket.socket = sock
        try:
            sock.settimeout(self._handshake_timeout)
            if plaintext_refusal.speaks_plaintext(sock):
                log.warning("closing %s: it does not speak TLS (a client without --tls-ca?)", peer)
                plaintext_refusal.refuse(sock, self._protocols.max_frame_bytes,
                                         self._handshake_timeout)
                return self._drop(sock)
            secured = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            self._replace(sock, secured)  # wrap_socket took over the file descriptor
            current = secured
            secured.do_handshake()  # under the handshake timeout, which wrap_socket kept
            return secured
        except OSError as exc:  # ssl.SSLError, a timeout, a reset
            log.warning("closing %s: TLS handshake failed (%s); a client without --tls-ca, or "
                        "one that does not trust this server's certificate?", peer, exc)
            return self._drop(current)

    def _drop(self, sock: socket.socket) -> None:
        sock.close()
        self._forget(sock)

    def _replace(self, old: socket.socket, new: socket.socket) -> None:
        with self._lock:
            self._connections.discard(old)
            self._connections.add(new)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._connections.discard(sock)
            self._drained.notify_all()

    def _close_all(self) -> None:
        """Stop reading, let calls in progress send their replies, then close the rest.

        Shutting down the read side wakes every connection waiting for a request (it
        sees end-of-file) while a handler still running can write its answer; after
        DRAIN_SECONDS whatever is left is cut off.
        """
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._shutdown_connections(socket.SHUT_RD)
        deadline = time.monotonic() + DRAIN_SECONDS
        with self._lock:
            while self._connections and time.monotonic() < deadline:
                self._drained.wait(deadline - time.monotonic())
        self._shutdown_connections(socket.SHUT_RDWR)

    def _shutdown_connections(self, how: int) -> None:
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with suppress(OSError):  # that connection is already closing
                # The plain socket's shutdown even for TLS: SSLSocket.shutdown drops its
                # TLS state, after which a reply still being written would go out unencrypted.
                socket.socket.shutdown(sock, how)


def _level_of(exc: TTransportException) -> int:
    """How loudly to log a closed connection: a hang-up is routine, a refused frame is not."""
    if exc.type == TTransportException.END_OF_FILE or isinstance(exc, IdleTimeout):
        return logging.DEBUG
    if exc.type == TTransportException.SIZE_LIMIT:
        return logging.ERROR
    return logging.WARNING
