"""The compute node's service in process: declared errors for bad requests, cancellation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict

CONFIG = {"epochs": 2, "eta": 0.0001, "hidden": [20]}


def request(**changes) -> ttypes.WorkRequest:
    fields = dict(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u1", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="train_letters1.txt",
        config_json=json.dumps(CONFIG),
        weights=dict_to_wire(mlp.init_params(mlp.MLPSpec(hidden=(20,)))), scheduling_policy=2)
    fields.update(changes)
    return ttypes.WorkRequest(**fields)


def handler(load: float = 0.0, delay: float = 0.0) -> ComputeNodeHandler:
    return ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(load, delay, seed=1))


def test_a_unit_returns_the_delta_of_local_training():
    result = handler().train_with_weights(request())
    assert result.accepted and result.outcome == ttypes.UnitOutcome.COMPLETED
    assert result.num_samples == 1500
    update = wire_to_dict(result.update)
    assert set(update) == {"W", "V"} and np.abs(update["V"]).sum() > 0


@pytest.mark.parametrize("changes, message", [
    ({"algorithm": "nope"}, "unknown algorithm 'nope'; known: delta_avg"),
    ({"model": "dcgan"}, "cannot train model"),
    ({"dataset": "missing"}, "does not exist"),
    ({"unit_path": "../../etc/passwd"}, "escapes the data root"),
    ({"unit_path": "train_letters99.txt"}, "does not exist"),
    ({"config_json": "{not json"}, "not valid JSON"),
    ({"config_json": json.dumps({"epochs": "many"})}, "'epochs' must be of type int"),
    ({"config_json": json.dumps({"epoch": 3})}, "unknown config key 'epoch'"),
    ({"weights": []}, "do not match the model's tensors"),
    ({"scheduling_policy": 9}, "unknown scheduling policy 9"),
])
def test_bad_requests_get_invalid_request_saying_what_is_wrong(changes, message):
    with pytest.raises(ttypes.InvalidRequest) as info:
        handler().train_with_weights(request(**changes))
    assert message in info.value.message


def test_another_protocol_version_is_refused_clearly():
    with pytest.raises(ttypes.VersionMismatch) as info:
        handler().train_with_weights(request(protocol_version=PROTOCOL_VERSION + 1))
    assert info.value.expected == PROTOCOL_VERSION
    assert "same release" in info.value.message


def test_rejection_is_an_answer_not_an_error():
    result = handler(load=1.0).train_with_weights(request())
    assert not result.accepted and result.outcome == ttypes.UnitOutcome.REJECTED
    assert result.update == []


def test_cancel_releases_a_unit_waiting_in_its_load_delay():
    node = handler(load=1.0, delay=60.0)
    answers = []
    worker = threading.Thread(
        target=lambda: answers.append(node.train_with_weights(request(scheduling_policy=1))))
    worker.start()
    cancelled = 0
    for _ in range(2000):  # until the unit is registered; bounded
        cancelled = node.cancel_unit(ttypes.CancelUnitRequest(run_id="r", unit_id="u1")).cancelled
        if cancelled:
            break
        worker.join(0.005)
    worker.join(10)
    assert cancelled == 1
    assert answers[0].outcome == ttypes.UnitOutcome.CANCELLED
    assert node.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)).units_running == 0
