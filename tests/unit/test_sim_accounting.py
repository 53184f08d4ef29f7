"""The simulator's failure accounting (devtools/simulation/accounting.py) on event logs
written by hand: a unit is discarded after exactly its failures, none too early, none
queued again once they are used up; refused results are no failures; a resume starts
the count again; an attempt still out decides; a stream fails after exactly a pass of
units discarded in a row."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from devtools.simulation.accounting import discard_streak, failure_accounting

RUN = "sim1"


def ledger(tmp_path: Path, *events: tuple, unit: str = "u") -> Path:
    """A store whose unit ``unit``'s events are ``events``: (attempt, from, to, attempt
    status, reason), in the order written (added to what the store holds)."""
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE IF NOT EXISTS unit_events (id INTEGER PRIMARY KEY, run_id TEXT, "
               "round INTEGER, unit_id TEXT, attempt INTEGER, from_status TEXT, "
               "to_status TEXT, attempt_status TEXT, reason TEXT)")
    db.executemany("INSERT INTO unit_events (run_id, round, unit_id, attempt, from_status, "
                   "to_status, attempt_status, reason) VALUES (?, 1, ?, ?, ?, ?, ?, ?)",
                   [(RUN, unit, *event) for event in events])
    db.commit()
    db.close()
    return path


def started(attempt: int, status: str = "pending") -> tuple:
    return (attempt, status, "in_progress", "in_progress", None)


def ended(attempt: int, end: str, to: str = "failed", reason: str = "invalid result",
          before: str = "in_progress") -> tuple:
    return (attempt, before, to, end, reason)


def test_a_unit_discarded_after_exactly_its_failures_passes(tmp_path: Path) -> None:
    path = ledger(tmp_path, started(1), ended(1, "failed"), started(2, "failed"),
                  ended(2, "discarded", "discarded"))
    assert failure_accounting(path, RUN, 2) == []


def test_a_unit_queued_again_after_its_last_failure_is_reported(tmp_path: Path) -> None:
    path = ledger(tmp_path, started(1), ended(1, "failed"), started(2, "failed"),
                  ended(2, "failed"), started(3, "failed"), ended(3, "discarded", "discarded"))
    problems = failure_accounting(path, RUN, 2)
    assert problems == ["failure accounting: unit 1/u: attempt 2 was its failure 2 with no "
                        "other attempt out, and the unit was not discarded (it is discarded "
                        "after 2)"]


def test_a_unit_discarded_too_early_is_reported(tmp_path: Path) -> None:
    path = ledger(tmp_path, started(1), ended(1, "discarded", "discarded"))
    assert failure_accounting(path, RUN, 2) == [
        "failure accounting: unit 1/u: discarded (attempt 1) after 1 failures; it is "
        "discarded after 2"]


def test_an_attempt_still_out_decides(tmp_path: Path) -> None:
    """The limit reached while a backup is out: the backup's failure discards the unit."""
    path = ledger(tmp_path, started(1), started(2, "in_progress"),
                  ended(1, "failed", "in_progress"), ended(2, "discarded", "discarded"))
    assert failure_accounting(path, RUN, 1) == []


def test_refused_results_are_no_failures_and_reclaimed_attempts_are(tmp_path: Path) -> None:
    stale = ended(1, "stale", "stale", "stale: computed from version 1, 3 behind")
    late = ended(2, "stale", "stale", "arrived after round 1 ended")
    reclaimed = ended(3, "stale", "stale", "no progress for 30s")
    path = ledger(tmp_path, started(1), stale, started(2, "stale"), late,
                  started(3, "stale"), reclaimed)
    assert failure_accounting(path, RUN, 2) == []  # one failure: not yet the limit
    assert failure_accounting(path, RUN, 1)[0].startswith(
        "failure accounting: unit 1/u: attempt 3 was its failure 1")


def test_a_resume_starts_the_count_again(tmp_path: Path) -> None:
    reopened = (None, "cancelled", "pending", None, "reopened: the run resumed")
    cancelled = (None, "failed", "cancelled", None, "the coordinator stopped")
    path = ledger(tmp_path, started(1), ended(1, "failed"), cancelled, reopened,
                  started(2), ended(2, "failed"), started(3, "failed"),
                  ended(3, "discarded", "discarded"))
    assert failure_accounting(path, RUN, 2) == []


def test_a_late_failure_of_a_settled_unit_is_let_be(tmp_path: Path) -> None:
    path = ledger(tmp_path, started(1), started(2, "in_progress"),
                  ended(2, "completed", "completed", None),
                  ended(1, "failed", "completed", before="completed"))
    assert failure_accounting(path, RUN, 1) == []


def discarded(tmp_path: Path, *units: str) -> Path:
    for unit in units:
        path = ledger(tmp_path, started(1), ended(1, "discarded", "discarded"), unit=unit)
    return path


def test_a_stream_fails_after_exactly_a_pass_of_discards_in_a_row(tmp_path: Path) -> None:
    path = discarded(tmp_path, "a", "b", "c")
    said = "the last {} units (a pass over the data) all failed and no result was kept"
    assert discard_streak(path, RUN, 3, said.format(3)) == []
    assert "failed after 4 units discarded in a row (3 in the ledger)" in discard_streak(
        path, RUN, 3, said.format(4))[0]
    assert "4 units" in discard_streak(path, RUN, 4, said.format(4))[0]  # too early
    assert "3 units were discarded in a row" in discard_streak(path, RUN, 3, "")[0]


def test_a_kept_result_or_a_resume_ends_a_row_of_discards(tmp_path: Path) -> None:
    discarded(tmp_path, "a", "b")
    ledger(tmp_path, started(1), ended(1, "completed", "completed", None), unit="c")
    path = discarded(tmp_path, "d", "e")
    ledger(tmp_path, (None, "discarded", "pending", None, "reopened: resumed"), unit="e")
    path = discarded(tmp_path, "f", "g")
    assert discard_streak(path, RUN, 3, "") == []
