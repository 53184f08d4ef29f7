"""What a peer can cost the dashboard: connections, time and memory, bounded before uvicorn
and the application see a request, as the Thrift ports bound theirs (wire/limits.py).

* `GuardedProtocol`, uvicorn's HTTP/1.1 protocol with the Thrift ports' guards: at most
  MAX_CONNECTIONS connections and MAX_CONNECTIONS_PER_PEER from one address, the extra
  ones closed at once (and logged at most once a minute); a request must arrive whole
  (head and body) within REQUEST_SECONDS of the connection's opening, TLS handshake
  included, or of the previous answer, so idle, silent and trickling connections are cut
  off. It does the TLS handshake itself, after those checks, so connections still
  handshaking count and are bounded too.
* `BodyLimit`, around the application: a request body must announce its length
  (Content-Length) and be at most MAX_BODY_BYTES (the login form's), else it is refused
  before a byte of it is read. Request heads are bounded by h11 (MAX_HEAD_BYTES).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from thrift_trainer.wire.limits import ConnectionSlots, RefusalLog

log = logging.getLogger("coordinator.dashboard")

MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_PEER = 16  # a browser opens about 6, Prometheus 1
REQUEST_SECONDS = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 4096


@dataclass
class Guards:
    """One dashboard's connection slots, refusal log and TLS context (None: plain HTTP)."""

    port: int
    tls: ssl.SSLContext | None = None
    request_seconds: float = REQUEST_SECONDS
    slots: ConnectionSlots = field(
        default_factory=lambda: ConnectionSlots(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER))

    def __post_init__(self) -> None:
        self.refusals = RefusalLog(self.port)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol behind the dashboard's guards (see the module docstring)."""

    def __init__(self, *args: Any, guards: Guards, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guards = guards
        self._host: str | None = None  # the address whose slot this connection holds
        self._due: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []  # decrypted before uvicorn's part was set up
        self._handshake: asyncio.Task[None] | None = None  # held: a task must be referenced

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        address = get_remote_addr(transport)  # type: ignore[arg-type]
        host = address[0] if address else ""
        refused = self.guards.slots.acquire(host)
        if refused is not None:
            self.guards.refusals.refused(refused)
            transport.abort()  # type: ignore[attr-defined]
            return
        self._host = host
        self._arm(transport)
        if self.guards.tls is None:
            super().connection_made(transport)  # type: ignore[arg-type]
        else:
            self._handshake = self.loop.create_task(
                self._secure(transport))  # type: ignore[arg-type]

    async def _secure(self, transport: asyncio.Transport) -> None:
        """The TLS handshake, within the deadline of the connection's first request."""
        assert self.guards.tls is not None
        try:
            secured = await self.loop.start_tls(
                transport, self, self.guards.tls, server_side=True,
                ssl_handshake_timeout=self.guards.request_seconds)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            log.debug("dashboard: TLS handshake failed: %s", exc)
            transport.abort()
            self._end()
            return
        super().connection_made(secured)  # type: ignore[arg-type]
        early, self._early = b"".join(self._early), []
        if early:
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:  # the handshake ended, but this task has not resumed yet
            self._early.append(data)
            return
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not cycle.response_complete:
            self._disarm()  # in whole: the application answers it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(self.transport)  # the next request is due in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        if self.transport is not None:  # uvicorn's part was set up: it ends it
            super().connection_lost(exc)

    def _arm(self, transport: asyncio.BaseTransport) -> None:
        self._disarm()
        self._due = self.loop.call_later(self.guards.request_seconds, transport.close)

    def _disarm(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None

    def _end(self) -> None:
        """Give the slot back (once) and stop the deadline."""
        self._disarm()
        if self._host is not None:
            self.guards.slots.release(self._host)
            self._host = None


class BodyLimit:
    """ASGI middleware refusing a request body without a length, or over ``max_bytes``,
    before the application reads any of it; the connection is closed after the answer."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope: Scope) -> PlainTextResponse | None:
        headers = dict(scope["headers"])
        close = {"Connection": "close"}
        if b"transfer-encoding" in headers:
            return PlainTextResponse("411 a request body needs a Content-Length\n",
                                     status_code=411, headers=close)
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            return PlainTextResponse(f"413 request bodies are at most {self.max_bytes} "
                                     "bytes here\n", status_code=413, headers=close)
        return None
