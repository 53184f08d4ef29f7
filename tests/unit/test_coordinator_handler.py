"""The coordinator's service in process: validation before a run starts, status lookups."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coordinator.handler import CoordinatorHandler
from coordinator.run import CoordinatorSettings
from coordinator.store_lock import StoreInUse
from training.datapaths import DEFAULT_DATA_ROOT
from wire.generated import PROTOCOL_VERSION, ttypes


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
