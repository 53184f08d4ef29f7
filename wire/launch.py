"""What both server commands do around their server: port files and signal handling."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


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
