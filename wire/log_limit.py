"""Rate-limiting of repeated log lines: one line with a count instead of a flood.

A loop that fails the same way (every node benched, a peer that keeps sending garbage)
can log the same warning hundreds of times a second, which buries everything else and
fills disks. `RepeatLimiter` lets the first record of a kind through, counts the repeats
within the window that follows, and emits one summary line, "<the last repeat> (repeated
N times in the last 10 s)", when the next record of that kind passes after the window,
when any later record shows the window has closed, or at exit.

Of a repeat only its text is kept, never the record: a record's arguments may be an
exception whose traceback holds a whole received frame, which must not outlive the line.

Records are "of a kind" when they come from the same logger at the same level and:
  * for warnings and errors, have the same message template (`log.warning("unit %s ...",
    unit)` for every unit is one kind: the flood is the same condition, unit after unit);
  * for info and debug lines, have the same text (progress lines such as "round 3/6" share
    a template but each says something new).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_SECONDS = 10.0
MAX_KINDS = 4096  # kinds tracked at once; beyond this, new kinds pass untracked
_SUMMARY = "repeat_summary"  # attribute marking our own summary records

Key = tuple[str, int, str]


@dataclass(frozen=True)
class _Said:
    """What the summary line needs of a repeated record: where it came from and its text."""

    name: str
    levelno: int
    pathname: str
    lineno: int
    text: str

    @classmethod
    def of(cls, record: logging.LogRecord) -> _Said:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the template
            text = str(record.msg)
        return cls(record.name, record.levelno, record.pathname, record.lineno, text)


@dataclass
class _Window:
    ends: float
    repeats: int = 0
    last: _Said | None = None


class RepeatLimiter(logging.Filter):
    """A handler filter; `emit` receives the summary records (usually `handler.handle`)."""

    def __init__(self, emit: Callable[[logging.LogRecord], object],
                 window: float = WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._emit, self._window_seconds, self._clock = emit, window, clock
        self._windows: dict[Key, _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        with self._lock:
            now = self._clock()
            closed = self._close_windows(now)
            passes = self._admit(_key(record), record, now)
        for summary in closed:  # outside the lock: emitting runs this filter again
            self._emit(summary)
        return passes

    def flush(self) -> None:
        """Emit the summaries of every open window (at exit)."""
        with self._lock:
            closed = self._close_windows(float("inf"))
        for summary in closed:
            self._emit(summary)

    def _admit(self, key: Key, record: logging.LogRecord, now: float) -> bool:
        window = self._windows.get(key)
        if window is not None:
            window.repeats += 1
            window.last = _Said.of(record)
            return False
        if len(self._windows) < MAX_KINDS:
            self._windows[key] = _Window(ends=now + self._window_seconds)
        return True

    def _close_windows(self, now: float) -> list[logging.LogRecord]:
        closed = [key for key, window in self._windows.items() if window.ends <= now]
        summaries = []
        for key in closed:
            window = self._windows.pop(key)
            if window.last is not None:
                summaries.append(self._summary(window))
        return summaries

    def _summary(self, window: _Window) -> logging.LogRecord:
        last = window.last
        assert last is not None
        times = "time" if window.repeats == 1 else "times"
        summary = logging.LogRecord(
            last.name, last.levelno, last.pathname, last.lineno,
            "%s (repeated %d %s in the last %g s)",
            (last.text, window.repeats, times, self._window_seconds), None)
        setattr(summary, _SUMMARY, True)
        return summary


def _key(record: logging.LogRecord) -> Key:
    text = str(record.msg) if record.levelno >= logging.WARNING else record.getMessage()
    return record.name, record.levelno, text


def install(handlers: list[logging.Handler], window: float = WINDOW_SECONDS) -> None:
    """Put a RepeatLimiter on each handler that has none yet."""
    for handler in handlers:
        if any(isinstance(f, RepeatLimiter) for f in handler.filters):
            continue
        limiter = RepeatLimiter(handler.handle, window)
        handler.addFilter(limiter)
        atexit.register(limiter.flush)  # runs before logging's own shutdown (LIFO)


def setup_logging(level: str | int, fmt: str) -> None:
    """The commands' logging: basicConfig on stderr, with repeated lines rate-limited.
    Handlers that were there before (a test's log capture) are left as they are."""
    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=level, format=fmt)
    install([h for h in root.handlers if h not in before])


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """--log-level of a server command, the level `setup_logging` takes."""
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="the least severe messages logged: DEBUG adds each unit's "
                             "comings and goings, WARNING keeps only problems (default INFO)")
