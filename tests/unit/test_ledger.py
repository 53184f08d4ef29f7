"""The engine's ledger: refusals are logged, writes SQLite cannot make stop the run."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from thrift_trainer.coordinator.run_store import (
    IllegalTransition,
    RunStore,
    StoreUnavailable,
    UnknownRecord,
)
from thrift_trainer.engine.ledger import UnitLedger


def test_a_refused_write_is_only_logged_when_not_strict(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    with RunStore(tmp_path / "runs.db") as store:
        store.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        ledger = UnitLedger(store, "r1", on_failure=calls.append, strict=False)
        with caplog.at_level(logging.WARNING, logger="engine.ledger"):
            ledger.finished(1, "nope", 1, "node1:1", "completed")  # no such unit
        ledger.check()
    assert calls == [] and "run store refused unit_finished" in caplog.text


def test_a_refused_write_raises_in_strict_mode(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        store.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        ledger = UnitLedger(store, "r1", strict=True)
        ledger.plan_units(1, ["u1"])
        ledger.started(1, "u1", 1, "node1:1")
        ledger.finished(1, "u1", 1, "node1:1", "completed")
        with pytest.raises(IllegalTransition, match="from completed to in_progress"):
            ledger.started(1, "u1", 2, "node1:1")  # a settled unit does not start again
        with pytest.raises(UnknownRecord, match="no attempt 7"):
            ledger.finished(1, "u1", 7, "node1:1", "failed")


def test_the_tests_run_the_ledger_strict(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        assert UnitLedger(store, "r1").strict  # tests/conftest.py sets TRAINER_STRICT_LEDGER


def test_a_write_sqlite_cannot_make_is_kept_reported_once_and_raised_by_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    RunStore(path).close()
    with closing(sqlite3.connect(path)) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    calls: list[str] = []
    monkeypatch.setenv("TRAINER_STORE_MAX_PAGES", str(pages + 2))
    with RunStore(path) as store:
        store.create_run("r1", algorithm="a", model="m", dataset="d", rounds=1)
        ledger = UnitLedger(store, "r1", on_failure=calls.append)
        for round_index in range(1, 20):  # bounded: the cap is hit well before
            ledger.plan_units(round_index, [f"u{i}-{'x' * 100}" for i in range(200)])
            if calls:
                break
        ledger.plan_units(99, ["one-more"])  # a second failure is not reported again
    assert len(calls) == 1 and calls[0] == f"run store {path}: database or disk is full"
    with pytest.raises(StoreUnavailable, match="database or disk is full"):
        ledger.check()
