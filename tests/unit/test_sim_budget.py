"""The simulator's privacy budget check (devtools/simulation/budget.py) on stores and
releases made by hand: a store whose rounds, or charges, cover every release seen passes;
one that lags a release a node was sent, the checkpoint or the status shows, or a round
computed twice from different results, is reported."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np

from devtools.simulation.budget import (
    Releases,
    budget_problems,
    charged_releases,
    weights_digest,
)
from thrift_trainer.coordinator.checkpoint import Checkpoint, save_checkpoint
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire

RUN = "sim1"


def store_with_rounds(tmp_path: Path, rounds: int) -> Path:
    """A run store (the coordinator's own) whose run has recorded ``rounds`` rounds."""
    path = tmp_path / "runs.db"
    store = RunStore(path)
    try:
        store.create_run(RUN, algorithm="delta_avg", model="mlp_classifier",
                         dataset="letters", rounds=3)
        for index in range(1, rounds + 1):
            store.record_round(RUN, index, validation_error=0.5, validation_loss=1.0,
                               train_loss=1.0, seconds=1.0, completed_units=2,
                               discarded_units=0)
    finally:
        store.close()
    return path


def request(version: int, value: float, kind: str | None = None) -> ttypes.WorkRequest:
    """A unit's request whose weights are release ``version`` (all ``value``)."""
    weights = dict_to_wire({"w": np.full((2, 3), value, dtype=np.float32)})
    return ttypes.WorkRequest(run_id=RUN, round=version + (kind is None), unit_id="client0",
                              attempt=1, weights=weights, model_version=version, kind=kind)


def test_the_store_charges_its_rounds_read_with_plain_sql(tmp_path: Path) -> None:
    assert charged_releases(store_with_rounds(tmp_path, 2), RUN) == 2
    assert charged_releases(tmp_path / "runs.db", "another") == 0
    assert charged_releases(tmp_path / "none.db", RUN) == 0  # never opened


def test_the_store_charges_its_privacy_charges_where_they_outnumber_its_rounds(
        tmp_path: Path) -> None:
    """A round computed twice and seen twice (distributed DP) is charged twice, and a
    resume drops the rounds after its checkpoint but never a charge."""
    path = store_with_rounds(tmp_path, 1)
    with RunStore(path) as store:
        for round_index in (1, 2, 2):
            store.charge_release(RUN, round_index, 1.0)
    assert charged_releases(path, RUN) == 3
    releases = Releases()
    for value in (2.0, 2.5):
        releases.node_sent(request(2, value, kind="evaluate"))
    assert budget_problems(charged_releases(path, RUN), releases, "at the end") == []


def test_a_store_of_a_schema_before_the_charges_charges_its_rounds(tmp_path: Path) -> None:
    path = store_with_rounds(tmp_path, 2)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP TABLE privacy_charges")
    assert charged_releases(path, RUN) == 2


def test_a_store_that_charges_every_release_seen_passes(tmp_path: Path) -> None:
    releases = Releases()
    for version in (0, 1, 2):  # release 0: the initial weights, no release
        releases.node_sent(request(version, float(version)))
    releases.node_sent(request(2, 2.0))  # the same release again: a unit sent it too
    releases.seen(2, "the status")
    assert budget_problems(charged_releases(store_with_rounds(tmp_path, 2), RUN),
                           releases, "at the end") == []


def test_a_store_behind_a_release_a_node_was_sent_is_reported(tmp_path: Path) -> None:
    releases = Releases()
    releases.node_sent(request(1, 1.0))
    releases.node_sent(request(2, 2.0, kind="evaluate"))  # sent before its round was written
    problems = budget_problems(charged_releases(store_with_rounds(tmp_path, 1), RUN),
                               releases, "coordinator1 ended")
    assert problems[0] == ("privacy budget: coordinator1 ended, the store charges 1 "
                           "releases, and release 2 was visible (sent to evaluate unit "
                           "client0 of round 2)")
    assert "were sent 2 different ones" in problems[1]


def test_a_status_or_checkpoint_ahead_of_the_store_is_reported(tmp_path: Path) -> None:
    store = charged_releases(store_with_rounds(tmp_path, 1), RUN)
    status = Releases()
    status.seen(2, "the status of coordinator1")
    assert budget_problems(store, status, "coordinator1 ended") == [
        "privacy budget: coordinator1 ended, the store charges 1 releases, and release 2 "
        "was visible (the status of coordinator1)"]
    run_dir = tmp_path / "runs" / RUN
    run_dir.mkdir(parents=True)
    save_checkpoint(run_dir, Checkpoint(2, {"w": np.zeros(3, np.float32)}, {}, None), {})
    checkpoint = Releases()
    checkpoint.saw_checkpoint(run_dir)
    assert checkpoint.highest == 2
    assert "release 2 was visible (the checkpoint)" in budget_problems(store, checkpoint,
                                                                       "at the end")[0]


def test_a_round_computed_twice_from_different_results_counts_twice(tmp_path: Path) -> None:
    """Round 2 sent, the coordinator killed, round 2 computed again from other results
    and sent: two releases under one index, which two rounds of the store must charge."""
    releases = Releases()
    releases.node_sent(request(1, 1.0))
    releases.node_sent(request(2, 2.0))
    releases.node_sent(request(2, 2.5))
    assert releases.highest == 2
    problems = budget_problems(charged_releases(store_with_rounds(tmp_path, 2), RUN),
                               releases, "at the end")
    assert problems == ["privacy budget: at the end, the store charges 2 releases, and "
                        "nodes were sent 3 different ones (rounds computed twice: [2])"]


def test_weights_a_node_kept_count_by_their_index_alone() -> None:
    releases = Releases()
    cached = request(1, 1.0)
    cached.weights = []  # weights_cached: the node uses those it kept
    releases.node_sent(cached)
    assert (releases.highest, releases.sent) == (1, set())
    assert weights_digest(request(1, 1.0).weights) != weights_digest(request(1, 2.0).weights)
