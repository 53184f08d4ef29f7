"""What both server commands do around their server: port files, signal handling, and a
warning when the server answers anyone on the network."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
from collections.abc import Callable

from thrift_trainer.wire import security

log = logging.getLogger(__name__)


def write_port_file(path: str, port: int) -> None:
    """Write the bound port atomically, so a script never reads half a number."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM and SIGINT, for a graceful shutdown."""

    def handler(signum: int, frame: object) -> None:  # noqa: ARG001 - signal signature
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def exposure_warning(addresses: list[tuple[str, int]], token: str | None) -> str | None:
    """One line saying that the servers at `addresses` (host, port) answer anyone who
    reaches them, or None when a token is required or they listen on loopback alone."""
    exposed = [f"{host or '0.0.0.0'}:{port}" for host, port in addresses
               if not _is_loopback(host)]
    if token or not exposed:
        return None
    # Not worded "listening on": scripts read the port from the line that is.
    them = "it" if len(exposed) == 1 else "them"
    return (f"served without a token: anyone who can reach {', '.join(exposed)} may use "
            f"{them}; give every process --token-file (or {security.TOKEN_ENV}), or "
            "--host 127.0.0.1 to serve this machine alone (docs/deployment.md)")


def warn_if_exposed(addresses: list[tuple[str, int]]) -> None:
    """Log `exposure_warning` for this process's token, if there is one to give."""
    warning = exposure_warning(addresses, security.current().token)
    if warning:
        log.warning(warning)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name or "" (every interface): reachable from elsewhere
        return False
