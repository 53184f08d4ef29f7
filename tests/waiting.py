"""Waiting on a condition in tests: polled often, bounded by a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    """True as soon as `condition()` holds, False once `seconds` have passed without it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False
