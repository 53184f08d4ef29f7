"""Repeated log lines collapse into one line with a count (a fake clock drives the window)."""

from __future__ import annotations

import io
import logging

import pytest

from thrift_trainer.wire.log_limit import RepeatLimiter, install, setup_logging


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged():
    """A logger writing to a string through a handler with a limiter on a fake clock."""
    clock = FakeClock()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    limiter = RepeatLimiter(handler.handle, window=10.0, clock=clock)
    handler.addFilter(limiter)
    logger = logging.getLogger("test.log_limit")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield logger, clock, limiter, lambda: stream.getvalue().splitlines()
    logger.removeHandler(handler)


def test_a_flood_of_one_warning_is_one_line_then_one_summary(logged):
    logger, clock, _, lines = logged
    for unit in range(300):
        logger.warning("round %d: unit %s was held by nobody; queued again", 1, f"u{unit}")
        clock.now += 0.004  # ~250 a second, as with every node benched
    assert lines() == ["WARNING round 1: unit u0 was held by nobody; queued again"]
    clock.now += 10.0
    logger.warning("round %d: unit %s was held by nobody; queued again", 2, "u7")
    assert lines()[1:] == [
        "WARNING round 1: unit u299 was held by nobody; queued again "
        "(repeated 299 times in the last 10 s)",
        "WARNING round 2: unit u7 was held by nobody; queued again"]


def test_the_summary_comes_once_any_later_line_shows_the_window_closed(logged):
    logger, clock, _, lines = logged
    for _ in range(3):
        logger.error("peer %s sent garbage", "10.0.0.1")
    clock.now += 10.0
    logger.info("something else")
    assert lines() == ["ERROR peer 10.0.0.1 sent garbage",
                       "ERROR peer 10.0.0.1 sent garbage (repeated 2 times in the last 10 s)",
                       "INFO something else"]


def test_info_lines_collapse_only_when_their_text_repeats(logged):
    logger, clock, _, lines = logged
    for round_index in range(1, 4):
        logger.info("round %d/%d done", round_index, 3)
        logger.info("waiting for nodes")
        clock.now += 1.0
    assert lines() == ["INFO round 1/3 done", "INFO waiting for nodes", "INFO round 2/3 done",
                       "INFO round 3/3 done"]


def test_kinds_are_per_logger_and_level(logged):
    logger, _, _, lines = logged
    other = logging.getLogger("test.log_limit.other")  # propagates to the same handler
    logger.warning("node %s is suspect", "a")
    logger.error("node %s is suspect", "b")
    other.warning("node %s is suspect", "c")
    logger.warning("node %s is suspect", "d")
    assert lines() == ["WARNING node a is suspect", "ERROR node b is suspect",
                       "WARNING node c is suspect"]


def test_a_lone_line_gets_no_summary_and_flush_reports_open_windows(logged):
    logger, clock, limiter, lines = logged
    logger.warning("once")
    logger.warning("twice %d", 1)
    logger.warning("twice %d", 2)
    clock.now += 1.0
    limiter.flush()
    assert lines() == ["WARNING once", "WARNING twice 1",
                       "WARNING twice 2 (repeated 1 time in the last 10 s)"]


def test_install_puts_one_limiter_per_handler():
    handler = logging.StreamHandler(io.StringIO())
    install([handler])
    install([handler])
    assert sum(isinstance(f, RepeatLimiter) for f in handler.filters) == 1


def test_setup_logging_leaves_existing_handlers_alone(caplog):
    setup_logging("INFO", "%(message)s")  # root already has pytest's capture handlers
    assert not any(isinstance(f, RepeatLimiter)
                   for h in logging.getLogger().handlers for f in h.filters)
