"""argparse `type=` helpers for the numeric options of the three commands.

Each helper turns the text of one option into a value or raises ArgumentTypeError,
which argparse reports as "argument --grace: ..." with exit code 2: a bad number is a
usage error at start-up, not a traceback or a misleading failure later (a NaN grace
that never expires, a zero heartbeat that busy-loops, a negative thread count).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

MAX_PORT = 65535
MAX_SEED = 2**31 - 1  # every seeded generator of the project accepts [0, 2**31)
MAX_SECONDS = 1e6  # ~11 days: longer waits overflow some timeouts and are surely typos


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def whole_number(text: str) -> int:
    """Any whole number, for a type whose caller checks the range itself."""
    return int(_number(text, int))


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in low..high (no upper bound when high is None)."""

    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    parse.__name__ = "int"
    return parse


def float_range(low: float, high: float, *, low_inclusive: bool) -> Callable[[str], float]:
    """A finite number in (low, high] or [low, high]; NaN and infinities are refused."""

    def parse(text: str) -> float:
        value = _number(text, float)
        too_low = value < low or (value == low and not low_inclusive)
        if not math.isfinite(value) or too_low or value > high:
            opening = "[" if low_inclusive else "("
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {opening}{low:g}, {high:g}], got {text}")
        return value

    parse.__name__ = "float"
    return parse


listen_port = int_range(0, MAX_PORT)  # 0: any free port
port = int_range(1, MAX_PORT)
positive_int = int_range(1)
non_negative_int = int_range(0)
seed = int_range(0, MAX_SEED)
seconds = float_range(0.0, MAX_SECONDS, low_inclusive=False)
probability = float_range(0.0, 1.0, low_inclusive=True)
positive_float = float_range(0.0, 1e12, low_inclusive=False)
non_negative_float = float_range(0.0, 1e12, low_inclusive=True)
non_negative_seconds = float_range(0.0, MAX_SECONDS, low_inclusive=True)
factor = float_range(1.0, 1000.0, low_inclusive=True)  # how many times slower, at least 1
chunk_mb = float_range(1 / 16, 2046.0, low_inclusive=True)  # MiB: 64 KiB up to a frame

NUMERIC_TYPES = (listen_port, port, positive_int, non_negative_int, seed, seconds,
                 probability, positive_float, non_negative_float, non_negative_seconds, factor,
                 chunk_mb)


def ports(text: str) -> list[int]:
    """One port, or a comma-separated list of them (one per host of a list of hosts)."""
    return [port(part.strip()) for part in text.split(",")]


def command_name(script: str) -> str:
    """The name a command is run by, for its usage lines: an installed console script's
    (``trainer-client``), else the repository's script (``client.py``)."""
    invoked = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return invoked if invoked.startswith("trainer-") else script
