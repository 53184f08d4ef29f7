"""The dashboard's HTTP(S) server: uvicorn in a daemon thread of the coordinator process.

It shares nothing with the Thrift server but the coordinator's state, read through
`dashboard.views.Views` (cached), so a page or a scrape never waits on a training call
and a training call never waits on a page. What a peer can cost it (connections in all and
per address, the time a request may take to arrive, the size of its head and body) is
bounded in `dashboard.guards`, which also does the TLS handshake.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from thrift_trainer.dashboard.access import Access
from thrift_trainer.dashboard.app import build_app
from thrift_trainer.dashboard.guards import (
    MAX_HEAD_BYTES,
    REQUEST_SECONDS,
    BodyLimit,
    GuardedProtocol,
    Guards,
)
from thrift_trainer.dashboard.prometheus import TimedHandler, latency_histogram, registry_for
from thrift_trainer.dashboard.views import Coordinator, Views
from thrift_trainer.wire import security

log = logging.getLogger("coordinator.dashboard")


@dataclass
class DashboardSettings:
    host: str
    port: int
    token: str | None = None  # the coordinator's shared token: required when set
    tls_cert: str | None = None  # with tls_key: HTTPS only, with the Thrift port's certificate
    tls_key: str | None = None


class Dashboard:
    """Binds at construction (so the port is known and a busy port fails at once);
    `start()` serves in a thread, `stop()` ends it."""

    def __init__(self, coordinator: Coordinator, settings: DashboardSettings) -> None:
        self.latency = latency_histogram()
        self.views = Views(coordinator)
        access = Access(settings.token, secure=settings.tls_cert is not None)
        app = build_app(self.views, registry_for(self.views, self.latency), access)
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self._socket = socket.create_server((settings.host, settings.port), family=family,
                                            backlog=128)
        self.port: int = self._socket.getsockname()[1]
        self.url = (f"{'https' if settings.tls_cert else 'http'}://"
                    f"{_url_host(settings.host)}:{self.port}/")
        tls = security.server_context(settings.tls_cert, settings.tls_key) \
            if settings.tls_cert and settings.tls_key else None
        guards = Guards(self.port, tls)
        # The guards bound connections (uvicorn's own limit would answer 503 to everyone
        # once idle peers fill it) and do TLS themselves, so uvicorn gets neither.
        config = uvicorn.Config(BodyLimit(app), log_config=None, log_level="warning",
                                access_log=False, lifespan="off", loop="asyncio",
                                http=functools.partial(GuardedProtocol, guards=guards),
                                limit_concurrency=None, timeout_keep_alive=REQUEST_SECONDS,
                                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def timed(self, handler: Any) -> TimedHandler:
        """`handler` observing each served call's time into the /metrics histogram."""
        return TimedHandler(handler, self.latency)

    def start(self) -> Dashboard:
        self._thread = threading.Thread(target=self._serve, name="dashboard", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except Exception:  # the coordinator goes on without its dashboard
            log.exception("the dashboard stopped")

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._socket.close()


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host
