"""Fault injection as a wrapper around the node's handler, and the Byzantine updates."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from compute_node.faults import FaultPlan, FaultyNode, corrupt_update, with_faults
from compute_node.handler import ComputeNodeHandler
from tests.unit.test_node_handler import handler, request
from tests.waiting import wait_until
from wire.generated import PROTOCOL_VERSION, ttypes
from wire.tensor_codec import wire_to_dict


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
