"""Cancel stops a unit's maths at the next batch, for every algorithm, and on the node."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from tests.waiting import wait_until
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.training.units import UnitJob
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire

torch.set_num_threads(1)

LETTERS = DEFAULT_DATA_ROOT / "letters"
MNIST = DEFAULT_DATA_ROOT / "mnist"
CANCEL_AT = 3  # batches a unit runs before it is cancelled
DEADLINE_SECONDS = 30.0  # generous bound on a loaded machine; a unit left running takes hours


class CancelledAfter(UnitControl):
    """A control that cancels its unit once the unit has started `CANCEL_AT` batches."""

    def step(self) -> None:
        if self.batches == CANCEL_AT:
            self.cancel()
        super().step()


CASES = [
    (DeltaAveraging, "mlp", {"epochs": 100, "hidden": [8]}, LETTERS),  # full batch: per epoch
    (DeltaAveraging, "mlp", {"epochs": 100, "hidden": [8], "local_optimizer": "adam",
                             "batch_size": 32}, LETTERS),
    (SyncSGD, "mlp", {"hidden": [8], "batch_size": 8}, LETTERS),
    (SyncSGD, "dcgan28-tiny", {"batch_size": 8, "images_per_work_unit": 64}, MNIST),
    (FLGan, "dcgan28-tiny", {"workers": 2, "batch_size": 16, "local_epochs": 50}, MNIST),
    (MDGan, "dcgan28-tiny", {"workers": 2, "batch_size": 8, "disc_steps": 50,
                             "batchnorm": False}, MNIST),
]


@pytest.mark.parametrize("algorithm_class, model, config, data", CASES,
                         ids=["delta_avg-gd", "delta_avg-adam", "sync_sgd-mlp", "sync_sgd-gan",
                              "fl_gan", "md_gan"])
def test_every_algorithm_stops_at_the_batch_after_its_cancel(
        algorithm_class: type[Algorithm], model: str, config: dict, data) -> None:
    algorithm = algorithm_class(model, config, data)
    unit = algorithm.plan_round(1)[0]
    weights = algorithm.unit_tensors(unit) or algorithm.initial_weights()
    control = CancelledAfter()
    job = UnitJob("run", 1, unit, model, algorithm.config, weights, sessions=SessionStore(),
                  control=control)
    with pytest.raises(UnitCancelled):
        algorithm_class.run_unit(job, data)
    assert control.batches == CANCEL_AT


def huge_request(attempt: int = 1) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u1", attempt=attempt,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="train_letters1.txt",
        config_json=json.dumps({"epochs": 1_000_000, "hidden": [8]}),
        weights=dict_to_wire(mlp.init_params(mlp.MLPSpec(hidden=(8,)))), scheduling_policy=2)


def test_a_node_reports_progress_and_a_cancel_stops_a_unit_in_its_maths() -> None:
    node = ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))
    answers: list[ttypes.TrainResult] = []
    workers = [threading.Thread(target=lambda a=attempt: answers.append(
        node.train_with_weights(huge_request(a))), daemon=True) for attempt in (1, 2)]
    for worker in workers:
        worker.start()
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    # Both units are held; one computes and the other waits its turn. The heartbeat's
    # count grows for both: the node is working through them.
    assert wait_until(lambda: len(node.ping(ping).progress) == 2
                    and min(node.ping(ping).progress.values()) > 0)
    seen = node.ping(ping).progress
    assert wait_until(lambda: all(v > seen[k] for k, v in node.ping(ping).progress.items()))
    assert node.cancel_unit(ttypes.CancelUnitRequest(run_id="r", unit_id="u1")).cancelled == 2
    for worker in workers:
        worker.join(DEADLINE_SECONDS)
        assert not worker.is_alive()
    assert [a.outcome for a in answers] == [ttypes.UnitOutcome.CANCELLED] * 2
    assert node.ping(ping).progress == {}
