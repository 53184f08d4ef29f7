"""The coordinator's service in process: validation before a run starts, status lookups."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from thrift_trainer.coordinator.handler import CoordinatorHandler
from thrift_trainer.coordinator.run import CoordinatorSettings
from thrift_trainer.coordinator.store_lock import StoreInUse
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes


def handler(tmp_path: Path, nodes: str = "127.0.0.1,1\n") -> CoordinatorHandler:
    nodes_file = tmp_path / "nodes.txt"
    nodes_file.write_text(nodes)
    return CoordinatorHandler(nodes_file, CoordinatorSettings(
        data_root=DEFAULT_DATA_ROOT, run_root=tmp_path / "runs", policy=2))


def train_request(**changes) -> ttypes.TrainRequest:
    fields = dict(protocol_version=PROTOCOL_VERSION, run_id="run-1", algorithm="delta_avg",
                  model="mlp", dataset="letters", rounds=1, config_json=json.dumps({}))
    fields.update(changes)
    return ttypes.TrainRequest(**fields)


@pytest.mark.parametrize("changes, message", [
    ({"run_id": "../escape"}, "run id '../escape' must be"),
    ({"rounds": 0}, "rounds: 0 is out of range 1..1000000"),
    ({"dataset": "nowhere"}, "nowhere does not exist"),
    ({"algorithm": "magic"}, "unknown algorithm 'magic'"),
    ({"config_json": json.dumps({"eta": -1.0})}, "'eta' must be positive"),
    ({"config_json": "[1, 2]"}, "must hold a JSON object"),
])
def test_bad_train_requests_are_refused_before_any_work(tmp_path, changes, message):
    coordinator = handler(tmp_path)
    with pytest.raises(ttypes.InvalidRequest) as info:
        coordinator.train(train_request(**changes))
    assert message in info.value.message
    assert coordinator.store.list_runs() == []
    assert not any(p.is_dir() for p in (tmp_path / "runs").iterdir())  # no run folder


def test_a_broken_nodes_file_fails_the_run_with_its_line(tmp_path):
    with pytest.raises(ttypes.TrainingFailed) as info:
        handler(tmp_path, nodes="localhost;9091\n").train(train_request())
    assert "line 1" in info.value.message


def test_status_of_an_unknown_run_is_a_declared_error(tmp_path):
    coordinator = handler(tmp_path)
    with pytest.raises(ttypes.UnknownRun):
        coordinator.status(ttypes.StatusRequest(run_id="nope"))
    with pytest.raises(ttypes.UnknownRun):
        coordinator.status(ttypes.StatusRequest(run_id=""))


def test_a_second_coordinator_on_the_same_store_is_refused_until_the_first_closes(tmp_path):
    first = handler(tmp_path)
    with pytest.raises(StoreInUse, match=rf"runs.db is in use by another coordinator "
                                         rf"\(pid {os.getpid()}\)"):
        handler(tmp_path)
    first.close()
    handler(tmp_path).close()


def stored_run(coordinator: CoordinatorHandler, run_id: str, rounds_done: int) -> None:
    """A run recorded as the coordinator records one: 2 units a round on two nodes."""
    store = coordinator.store
    store.create_run(run_id, algorithm="delta_avg", model="mlp", dataset="letters", rounds=3)
    for r in range(1, rounds_done + 1):
        store.plan_units(run_id, r, ["u1", "u2"])
        for unit, node in (("u1", "a:1"), ("u2", "b:2")):
            store.unit_started(run_id, r, unit, 1, node)
            store.unit_finished(run_id, r, unit, 1, node, "completed")
            store.node_answer(run_id, node, "completed", delayed=False, samples=10)
        store.node_answer(run_id, "b:2", "rejected", delayed=False)
        store.record_round(run_id, r, validation_error=0.5 - r / 10, validation_loss=1.0,
                           train_loss=0.9, seconds=1.0, completed_units=2, discarded_units=0)


def test_after_a_restart_runs_and_status_show_everything_the_store_kept(tmp_path):
    first = handler(tmp_path)
    stored_run(first, "old", rounds_done=2)
    first.store.end_run("old", "cancelled", "cancelled by the client")
    stored_run(first, "cut", rounds_done=1)  # still running when the coordinator stops
    first.close()
    restarted = handler(tmp_path)

    listed = {s.run_id: s for s in restarted.list_runs(ttypes.ListRunsRequest()).runs}
    old = listed["old"]
    assert (old.state, old.round, old.rounds) == ("cancelled", 2, 3)
    assert old.validation_error == pytest.approx(0.3)
    assert (old.units_done, old.units_total, old.rejected) == (4, 6, 2)
    assert {n.node: (n.accepted, n.rejected) for n in old.nodes} == {"a:1": (2, 0),
                                                                     "b:2": (2, 2)}
    assert all(n.state == "alive" for n in old.nodes)  # they answered as the run ended
    assert listed["cut"].state == "failed"  # marked when the coordinator started again

    status = restarted.status(ttypes.StatusRequest(run_id="old"))
    assert (status.run_id, status.units_done, status.message) == (
        "old", 4, "cancelled by the client")
    assert status.ledger["completed"] == 4
    latest = restarted.status(ttypes.StatusRequest(run_id=""))
    assert latest.run_id == "cut" and latest.validation_error == pytest.approx(0.4)
    assert restarted.cancel(ttypes.CancelRunRequest(run_id="old")).cancelled is False
    with pytest.raises(ttypes.UnknownRun, match="no run 'nope'"):
        restarted.status(ttypes.StatusRequest(run_id="nope"))


def test_status_without_a_run_id_on_an_empty_coordinator_says_there_is_none(tmp_path):
    with pytest.raises(ttypes.UnknownRun, match="has no runs yet"):
        handler(tmp_path).status(ttypes.StatusRequest(run_id=""))
