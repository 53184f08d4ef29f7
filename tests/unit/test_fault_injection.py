"""Fault injection as a wrapper around the node's handler, and the Byzantine updates."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from tests.unit.test_node_handler import handler, request
from tests.waiting import wait_until
from thrift_trainer.compute_node import faults
from thrift_trainer.compute_node.faults import FaultPlan, FaultyNode, corrupt_update, with_faults
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.units import UnitJob, UnitOutput, UnitSpec
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import wire_to_dict


def update(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=6)}


def norm(weights: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in weights.values())))


@pytest.mark.parametrize("mode, factor", [("signflip", -10.0), ("scaled", 100.0)])
def test_byzantine_updates_are_the_update_times_a_factor(mode, factor):
    given = update()
    spoilt = corrupt_update(given, mode)
    for name, value in given.items():
        assert spoilt[name].dtype == value.dtype
        np.testing.assert_allclose(spoilt[name], value * factor, rtol=1e-6)


def test_a_random_update_is_noise_of_the_update_norm():
    given = update(1)
    spoilt = corrupt_update(given, "random", np.random.default_rng(3))
    assert {k: (v.shape, v.dtype) for k, v in spoilt.items()} == {
        k: (v.shape, v.dtype) for k, v in given.items()}
    assert norm(spoilt) == pytest.approx(norm(given), rel=1e-5)
    correlation = np.corrcoef(spoilt["b"], given["b"])[0, 1]
    assert abs(correlation) < 0.99  # not the update itself


def test_the_production_handler_has_no_fault_branches():
    parameters = inspect.signature(ComputeNodeHandler.__init__).parameters
    assert not {"crash_after_units", "hang_after_units", "corrupt"} & set(parameters)
    plain = handler()
    assert with_faults(plain, FaultPlan()) is plain


def test_a_wrapped_node_sends_sign_flipped_updates_after_n_units():
    node = with_faults(handler(), FaultPlan(corrupt="signflip", corrupt_after_units=1))
    assert isinstance(node, FaultyNode)
    node.node_id = "byzantine"
    honest = node.train_with_weights(request())
    flipped = node.train_with_weights(request(attempt=2))
    assert flipped.node_id == honest.node_id == "byzantine"
    assert flipped.num_samples == honest.num_samples  # only the update lies
    expected = {k: v * -10 for k, v in wire_to_dict(honest.update).items()}
    for name, value in wire_to_dict(flipped.update).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6)


def test_a_wrapped_node_hangs_until_cancelled_and_still_answers_pings():
    node = with_faults(handler(), FaultPlan(hang_after_units=0))
    answers: list[ttypes.TrainResult] = []
    worker = threading.Thread(target=lambda: answers.append(node.train_with_weights(request())),
                              daemon=True)
    worker.start()
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    assert wait_until(lambda: node.ping(ping).units_running == 1, alive=worker.is_alive)
    assert node.ping(ping).progress == {"r/u1/1": 0}  # held, and not progressing
    node.cancel_unit(ttypes.CancelUnitRequest(run_id="r", unit_id="u1", attempt=1))
    worker.join(30)
    assert answers and answers[0].outcome == ttypes.UnitOutcome.CANCELLED


class RecordedWait(threading.Event):
    """A cancel flag that records how long a unit waited on it instead of waiting."""

    def __init__(self, cancelled: bool) -> None:
        super().__init__()
        self.waits: list[float] = []
        if cancelled:
            self.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


@pytest.mark.parametrize("cancelled", [False, True], ids=["runs", "cancelled"])
def test_a_slowed_node_holds_each_unit_its_maths_time_times_the_factor_less_one(
        monkeypatch, cancelled):
    clock = iter([10.0, 10.5])  # the maths takes 0.5 s
    monkeypatch.setattr(faults, "monotonic", lambda: next(clock))
    output = UnitOutput(update={}, num_samples=1, loss=0.0, error=0.0)
    plain = handler()
    plain.unit_runner = lambda algorithm, job, data_dir: output  # the maths the faults wrap
    node = with_faults(plain, FaultPlan(slowdown=3.0))
    flag = RecordedWait(cancelled)
    job = UnitJob("r", 1, UnitSpec("u1", "f"), "mlp", {}, {},
                  control=UnitControl(cancelled=flag))
    if cancelled:
        with pytest.raises(UnitCancelled):
            node._run_unit(DeltaAveraging, job, None)
    else:
        assert node._run_unit(DeltaAveraging, job, None) is output
    assert flag.waits == [pytest.approx(1.0)]  # (3 - 1) x 0.5 s, ended early by a cancel


def test_no_slowdown_leaves_the_handler_unwrapped():
    plain = handler()
    assert with_faults(plain, FaultPlan(slowdown=1.0)) is plain
