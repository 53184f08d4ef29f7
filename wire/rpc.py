"""Clients and a threaded server for the generated Thrift services.

Everything here speaks `wire.transport`'s framed transport with the
pure-Python binary protocol, with timeouts on connecting and reading, so a dead
peer turns into an exception instead of a hung thread.

Generated clients are not thread-safe: one call at a time per connection. Use
one `connect()` per thread, or a `ConnectionPool`, which hands each caller its
own connection.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Generic, TypeVar

from thrift.protocol.TProtocol import TProtocolBase
from thrift.Thrift import TProcessor
from thrift.transport.TTransport import TTransportException

from wire.transport import (
    DEFAULT_MAX_FRAME_BYTES,
    FramedSocketTransport,
    WireProtocolFactory,
    tune_socket,
)

log = logging.getLogger(__name__)

C = TypeVar("C")
ClientFactory = Callable[[TProtocolBase], C]


DRAIN_SECONDS = 5.0  # on stop, how long calls in progress may take to answer


class ConnectionFailed(Exception):
    """A connection could not be opened; the message names host:port and the cause."""


def open_transport(
    host: str,
    port: int,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float | None = 60.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> FramedSocketTransport:
    """Connect to host:port and return an open transport, or raise ConnectionFailed."""
    where = f"{host}:{port}"
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
    sock.settimeout(read_timeout)
    return FramedSocketTransport(sock, max_frame_bytes=max_frame_bytes, peer=where)


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
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._transport = open_transport(
            host,
            port,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_frame_bytes=max_frame_bytes,
        )
        self._client = client_cls(WireProtocolFactory(max_frame_bytes).getProtocol(self._transport))

    def __enter__(self) -> C:
        return self._client

    def __exit__(self, *exc_info: object) -> None:
        self._transport.close()


def set_read_timeout(client: Any, seconds: float | None) -> None:
    """Change the read timeout of a client made by `connect` or a `ConnectionPool`.

    Useful to wait long for a training call but briefly for a ping on the same
    connection. None waits forever.
    """
    transport_of(client).set_timeout(seconds)


def transport_of(client: Any) -> FramedSocketTransport:
    """The transport under a generated client (they keep their protocol in `_iprot`)."""
    transport = getattr(getattr(client, "_iprot", None), "trans", None)
    if not isinstance(transport, FramedSocketTransport):
        raise TypeError(f"{client!r} was not made by wire.rpc.connect or a ConnectionPool")
    return transport


class ConnectionPool(Generic[C]):
    """Thread-safe pool of connections to one server.

    `with pool.client() as c:` lends a connection for the block: an idle one
    if there is one, otherwise a new one. A connection whose block raised
    anything is closed, not returned, so a broken socket is never reused.
    Each borrowed client starts with the pool's read timeout.
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
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._client_cls = client_cls
        self.host, self.port = host, port
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._protocols = WireProtocolFactory(max_frame_bytes)
        self._idle: list[C] = []
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
        for client in idle:
            transport_of(client).close()

    def _checkout(self) -> C:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"connection pool for {self.host}:{self.port} is closed")
            client = self._idle.pop() if self._idle else None
        if client is None:
            transport = open_transport(
                self.host,
                self.port,
                connect_timeout=self._connect_timeout,
                max_frame_bytes=self._protocols.max_frame_bytes,
            )
            client = self._client_cls(self._protocols.getProtocol(transport))
        set_read_timeout(client, self._read_timeout)
        return client

    def _checkin(self, client: C) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(client)
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
    """

    def __init__(
        self,
        processor: TProcessor,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        idle_timeout: float | None = None,
        backlog: int = 128,
    ) -> None:
        self._processor = processor
        self._protocols = WireProtocolFactory(max_frame_bytes)
        self._idle_timeout = idle_timeout
        self._listener = socket.create_server((host, port), backlog=backlog)  # SO_REUSEADDR
        self._listener.setblocking(False)
        self.host: str = host
        self.port: int = self._listener.getsockname()[1]
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
            log.warning("accept failed on port %d: %s", self.port, exc)
            return
        peer = f"{address[0]}:{address[1]}"
        tune_socket(sock)
        sock.settimeout(self._idle_timeout)
        with self._lock:
            self._connections.add(sock)
        threading.Thread(
            target=self._serve_connection, args=(sock, peer), name=f"thrift-{peer}", daemon=True
        ).start()

    def _serve_connection(self, sock: socket.socket, peer: str) -> None:
        transport = FramedSocketTransport(
            sock, max_frame_bytes=self._protocols.max_frame_bytes, peer=peer
        )
        protocol = self._protocols.getProtocol(transport)
        try:
            while not self._stop_requested:
                self._processor.process(protocol, protocol)
        except TTransportException as exc:
            quiet = exc.type == TTransportException.END_OF_FILE
            log.log(logging.DEBUG if quiet else logging.WARNING, "closing %s: %s", peer, exc)
        except Exception as exc:  # a bad client must never take the server down
            log.warning("closing %s after a bad request: %r", peer, exc)
        finally:
            transport.close()
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
                sock.shutdown(how)
