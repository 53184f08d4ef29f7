"""The failure accounting of a simulated run's ledger, against the policy the run ran.

The engine discards a unit once its failures reach the run's `max_unit_failures`
(engine/work_queue.py's `WorkQueue.record_failure`, shared by rounds and streams) and
never before; while other attempts of the unit are still out, those decide. The run
store's event log (`unit_events`, plain SQL here, not the coordinator's code) replays
each unit's attempts in the order they were written, and two checks hold:

- a discarded unit failed at least `max_unit_failures` times;
- a failure that brings the unit's count to the limit with no other attempt of it out,
  the unit not yet settled, is the discard itself: the unit is not queued again.

So a unit whose attempts never overlap is discarded after exactly the configured
failures. A stream counts its discards too (`discard_streak`): it fails once a pass's
worth of units in a row is discarded with no result kept between them, and not before.

A failure is an attempt that ended `failed` or `discarded`, or `stale` when it was
reclaimed (past its deadline, its node dead); a `stale` result refused for its age or
for arriving after its round ended is not the unit's failure. A resume takes a unit up
with no failures (the store's reopening, the one move out of a settled status, starts
the count again, as the new coordinator's engine does).

A round writes an attempt's end after its lock is released, so another attempt may be
written in between: the checks count what was written before each event only where that
cannot make a correct run look wrong (a discard is held to all its failures, written
before or after it; a failure with another attempt still written as out is let be).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

SETTLED = frozenset({"completed", "discarded", "cancelled"})
FAILED_ENDS = frozenset({"failed", "discarded"})
# The reasons of a `stale` end that is no failure (engine/round_engine.py's
# AttemptEnd.STALE): a stream refusing an old result, a result after its round ended.
REFUSED_RESULTS = ("stale: ", "arrived after round ")
PREFIX = "failure accounting: "
# engine/stream_state.py's reason for failing a stream whose discards made a whole pass
STREAK_FAILED = re.compile(r"the last (\d+) units \(a pass over the data\) all failed")


@dataclass
class _Replay:
    """One unit's attempts since it was last taken up, as the event log tells them."""

    failures: int = 0
    live: set[int] = field(default_factory=set)
    discards: list[int] = field(default_factory=list)  # attempts that ended discarded


@dataclass(frozen=True)
class _Event:
    unit: str
    attempt: int | None
    from_status: str
    to_status: str
    attempt_status: str | None
    reason: str | None


def failure_accounting(store: Path, run_id: str, max_failures: int) -> list[str]:
    """What the ledger of ``run_id`` shows against discarding a unit after exactly
    ``max_failures`` failures (nothing: an empty list)."""
    replays: dict[str, _Replay] = {}
    problems: list[str] = []
    for event in _events(store, run_id):
        replay = replays.setdefault(event.unit, _Replay())
        if event.attempt is None:
            if event.from_status in SETTLED and event.to_status not in SETTLED:
                problems += _discards(event.unit, replay, max_failures)
                replays[event.unit] = _Replay()  # reopened by a resume
            continue
        problems += _attempt_event(event, replay, max_failures)
    for unit, replay in replays.items():
        problems += _discards(unit, replay, max_failures)
    return problems


def discard_streak(store: Path, run_id: str, pass_size: int, reason: str) -> list[str]:
    """What a stream's ledger and ``reason`` (why its run failed; "" when it completed)
    show against failing it exactly when ``pass_size`` units in a row were discarded. A
    stream writes its discards and kept results under its lock, in their order."""
    said = STREAK_FAILED.search(reason)
    longest = _longest_streak(_events(store, run_id))
    if said is None:
        if reason or longest < pass_size:
            return []
        return [f"{PREFIX}{longest} units were discarded in a row with no result kept, and "
                f"the stream went on (it fails after a pass, {pass_size} units)"]
    if int(said.group(1)) != pass_size or longest < pass_size:
        return [f"{PREFIX}the stream failed after {said.group(1)} units discarded in a row "
                f"({longest} in the ledger); it fails after a pass, {pass_size} units"]
    return []


def _longest_streak(events: list[_Event]) -> int:
    """The most units discarded in a row, no result kept between (a resume starts over)."""
    longest = streak = 0
    for event in events:
        if event.from_status in SETTLED:
            if event.attempt is None and event.to_status not in SETTLED:
                streak = 0  # reopened by a resume
            continue
        if event.to_status == "completed":
            streak = 0
        elif event.to_status == "discarded":
            streak += 1
            longest = max(longest, streak)
    return longest


def _events(store: Path, run_id: str) -> list[_Event]:
    db = sqlite3.connect(store)
    try:
        rows = db.execute("SELECT round || '/' || unit_id, attempt, from_status, to_status, "
                          "attempt_status, reason FROM unit_events WHERE run_id = ? "
                          "ORDER BY id", (run_id,)).fetchall()
    finally:
        db.close()
    return [_Event(*row) for row in rows]


def _attempt_event(event: _Event, replay: _Replay, max_failures: int) -> list[str]:
    """Replay one attempt's start or end; what it shows wrong."""
    if event.attempt_status == "in_progress":
        replay.live.add(event.attempt)
        return []
    replay.live.discard(event.attempt)
    if not _is_failure(event):
        return []
    replay.failures += 1
    if event.attempt_status == "discarded":
        replay.discards.append(event.attempt)
        return []
    if (replay.failures >= max_failures and not replay.live
            and event.from_status not in SETTLED):
        return [f"{PREFIX}unit {event.unit}: attempt {event.attempt} was its failure "
                f"{replay.failures} with no other attempt out, and the unit was not "
                f"discarded (it is discarded after {max_failures})"]
    return []


def _discards(unit: str, replay: _Replay, max_failures: int) -> list[str]:
    """A discard before the unit's failures reached the limit (all its failures counted,
    those written after the discard too)."""
    if replay.discards and replay.failures < max_failures:
        return [f"{PREFIX}unit {unit}: discarded (attempt {replay.discards[0]}) after "
                f"{replay.failures} failures; it is discarded after {max_failures}"]
    return []


def _is_failure(event: _Event) -> bool:
    if event.attempt_status in FAILED_ENDS:
        return True
    return (event.attempt_status == "stale"
            and not (event.reason or "").startswith(REFUSED_RESULTS))
