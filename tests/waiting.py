"""Waiting on a condition in tests: polled often, bounded by a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], seconds: float = 30.0, *,
               alive: Callable[[], bool] | None = None, interval: float = 0.01) -> bool:
    """True as soon as `condition()` holds; False once `seconds` have passed without it, or
    at once when `alive()` says what would make it hold has died (a process, a thread)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        if alive is not None and not alive():
            return condition()
        time.sleep(interval)
    return False
