"""The machine a benchmark figure was measured on, as the results files record it."""

from __future__ import annotations

import os
import platform
from contextlib import suppress
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's word where there is none)."""
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def describe(*versions: str) -> str:
    """"nproc 2, <CPU>, Python 3.11.7" and any ``versions`` given ("torch 2.13.0", ...)."""
    return ", ".join([f"nproc {os.cpu_count()}", cpu_model(),
                      f"Python {platform.python_version()}", *versions])
