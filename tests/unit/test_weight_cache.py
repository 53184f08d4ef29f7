"""Weights a node keeps between units (compute_node/weight_cache.py), what the coordinator
remembers having sent (engine/nodes/sent_weights.py), and the node's service answering a
request that refers to kept weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.weight_cache import WeightCache
from thrift_trainer.engine.nodes.sent_weights import SentWeights
from thrift_trainer.engine.tasks import Task
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict

CONFIG = {"epochs": 1, "eta": 0.0001, "hidden": [20]}


def arrays(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}


# ------------------------------------------------------------------ the node's cache


def test_kept_weights_come_back_as_writable_copies_of_what_was_put():
    cache = WeightCache()
    sent = arrays(1.5)
    assert cache.put("r", 3, "none", sent)
    sent["w"][0, 0] = 99.0  # the caller's arrays (a frame that gets reused) may change
    first = cache.get("r", 3, "none")
    assert first is not None and np.array_equal(first["w"], arrays(1.5)["w"])
    first["w"][:] = -1.0  # a unit may change its weights in place
    again = cache.get("r", 3, "none")
    assert again is not None and np.array_equal(again["w"], arrays(1.5)["w"])


def test_a_version_run_or_codec_not_held_is_none():
    cache = WeightCache()
    cache.put("r", 3, "none", arrays(1.0))
    assert cache.get("r", 4, "none") is None
    assert cache.get("other", 3, "none") is None
    assert cache.get("r", 3, "fp16") is None  # decoded from other tensors: never mixed


def test_only_the_newest_versions_of_a_run_are_kept():
    cache = WeightCache(versions_per_run=2)
    for version in (1, 2, 3):
        cache.put("r", version, "none", arrays(version))
    assert cache.versions("r") == [2, 3]
    assert not cache.put("r", 1, "none", arrays(1.0))  # older than both: not kept
    assert cache.versions("r") == [2, 3]


def test_the_runs_used_last_are_kept_and_a_dropped_run_is_gone():
    cache = WeightCache(max_runs=2)
    cache.put("a", 1, "none", arrays(1.0))
    cache.put("b", 1, "none", arrays(1.0))
    assert cache.get("a", 1, "none") is not None  # "a" used last: "b" goes first
    cache.put("c", 1, "none", arrays(1.0))
    assert cache.runs() == ["a", "c"]
    assert cache.drop_run("a") == 1 and cache.get("a", 1, "none") is None
    assert cache.drop_run("a") == 0


def test_the_bytes_kept_are_bounded_and_the_oldest_of_the_runs_used_least_go_first():
    size = sum(value.nbytes for value in arrays(1.0).values())
    cache = WeightCache(max_bytes=3 * size)
    for run_id, version in (("a", 1), ("a", 2), ("b", 1)):
        assert cache.put(run_id, version, "none", arrays(version))
    assert cache.nbytes == 3 * size
    assert cache.put("b", 2, "none", arrays(2.0))  # "a" was used least recently
    assert cache.versions("a") == [2] and cache.versions("b") == [1, 2]
    assert cache.nbytes == 3 * size
    assert not cache.put("c", 1, "none", {"big": np.zeros(4 * size, np.uint8)})  # too big
    assert cache.runs() == ["a", "b"] and cache.nbytes == 3 * size


def test_bounds_below_one_are_refused():
    with pytest.raises(ValueError):
        WeightCache(versions_per_run=0)


# ------------------------------------------------------------------ the coordinator's side


def task(weights: dict, round_index: int = 2, run_id: str = "r", unit: str = "u1") -> Task:
    return Task(run_id=run_id, round=round_index, unit_id=unit, attempt=1,
                algorithm="sync_sgd", model="mlp", dataset="letters", unit_path="p",
                config_json="{}", weights=weights, scheduling_policy=2)


def test_a_reference_needs_the_very_dict_the_node_completed_a_unit_with():
    sent, weights = SentWeights(), arrays(1.0)
    first = task(weights)
    assert not sent.refers(first)
    sent.sending(first)
    assert not sent.refers(task(weights, unit="u2"))  # not completed yet: sent at once
    sent.completed(first)
    assert sent.refers(task(weights, unit="u2"))
    assert not sent.refers(task(arrays(1.0), unit="u2"))  # equal values, another dict
    assert not sent.refers(task(weights, round_index=3))  # another version
    assert not sent.refers(task(weights, run_id="other"))
    assert not sent.refers(task({}))  # nothing to leave out


def test_units_with_their_own_tensors_are_never_references():
    """MD-GAN: every unit of a round carries a dict of its own, under one version."""
    sent = SentWeights()
    first, second = task(arrays(1.0), unit="u1"), task(arrays(2.0), unit="u2")
    for unit in (first, second):
        sent.sending(unit)
        sent.completed(unit)
    assert not sent.refers(first) and not sent.refers(second)
    sent.sending(first)  # sent again: the version stays unusable
    sent.completed(first)
    assert not sent.refers(first)


def test_tasks_without_weights_leave_the_reference_as_it_was():
    """A secure round's key, share and unmask steps carry no weights, each an empty dict
    of its own, under the round's version: before and between its training units."""
    sent, weights = SentWeights(), arrays(1.0)
    for step in (task({}, unit="keys"), task({}, unit="shares")):  # before any weights
        sent.sending(step)
        sent.completed(step)
    first = task(weights, unit="u1")
    sent.sending(first)
    sent.completed(first)
    unmask = task({}, unit="unmask")
    sent.sending(unmask)
    sent.completed(unmask)
    assert sent.refers(task(weights, unit="u2"))


def test_a_node_that_lost_the_weights_gets_them_again_before_any_reference():
    sent, weights = SentWeights(), arrays(1.0)
    sent.sending(task(weights))
    sent.completed(task(weights))
    sent.lost(task(weights))
    assert not sent.refers(task(weights))
    sent.sending(task(weights))
    sent.completed(task(weights))
    assert sent.refers(task(weights))
    sent.clear()  # the node may have restarted
    assert not sent.refers(task(weights))


def test_the_coordinator_remembers_only_the_newest_versions_and_runs():
    sent = SentWeights(versions_per_run=2, max_runs=2)
    kept = {}
    for round_index in (2, 3, 4):
        kept[round_index] = arrays(round_index)
        sent.sending(task(kept[round_index], round_index))
        sent.completed(task(kept[round_index], round_index))
    assert not sent.refers(task(kept[2], 2)) and sent.refers(task(kept[4], 4))
    for run_id in ("b", "c"):
        sent.sending(task(kept[4], 4, run_id))
    assert not sent.refers(task(kept[4], 4))  # run "r" was forgotten for "b" and "c"
    sent.forget_run("b")
    assert not sent.refers(task(kept[4], 4, "b"))


# ------------------------------------------------------------------ the node's service


def request(weights: list | None = None, cached: bool | None = None, version: int = 4,
            run_id: str = "r", config: dict | None = None) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id=run_id, round=version + 1, unit_id="u1",
        attempt=1, algorithm="delta_avg", model="mlp", dataset="letters",
        unit_path="train_letters1.txt", config_json=json.dumps(config or CONFIG),
        weights=weights if weights is not None else [], scheduling_policy=2,
        model_version=version, weights_cached=cached)


def handler() -> ComputeNodeHandler:
    return ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))


def initial() -> list[ttypes.Tensor]:
    return dict_to_wire(mlp.init_params(mlp.MLPSpec(hidden=(20,)), seed=3))


def test_a_reference_to_weights_not_held_asks_for_them():
    result = handler().train_with_weights(request(cached=True))
    assert result.outcome == ttypes.UnitOutcome.NEED_WEIGHTS and not result.accepted
    assert result.update == [] and result.model_version == 4


def test_a_reference_trains_exactly_as_the_weights_it_refers_to():
    node = handler()
    full = node.train_with_weights(request(initial()))
    assert full.outcome == ttypes.UnitOutcome.COMPLETED and full.model_version == 4
    referred = node.train_with_weights(request(cached=True))
    assert referred.outcome == ttypes.UnitOutcome.COMPLETED
    a, b = wire_to_dict(full.update), wire_to_dict(referred.update)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # another version, run or down codec is not held
    for other in (request(cached=True, version=5), request(cached=True, run_id="r2"),
                  request(cached=True, config={**CONFIG, "compression": {"down": "fp16"}})):
        assert node.train_with_weights(other).outcome == ttypes.UnitOutcome.NEED_WEIGHTS


def test_weights_sent_with_a_reference_flag_are_used_as_sent():
    node = handler()
    result = node.train_with_weights(request(initial(), cached=True))
    assert result.outcome == ttypes.UnitOutcome.COMPLETED
    assert node.weights.versions("r") == [4]


def test_dropping_a_runs_sessions_drops_its_weights():
    node = handler()
    node.train_with_weights(request(initial()))
    ack = node.drop_sessions(ttypes.DropSessionsRequest(protocol_version=PROTOCOL_VERSION,
                                                        run_id="r"))
    assert ack.ok and node.weights.versions("r") == []
    assert (node.train_with_weights(request(cached=True)).outcome
            == ttypes.UnitOutcome.NEED_WEIGHTS)


def test_weights_a_unit_could_not_use_are_not_kept():
    node = handler()
    with pytest.raises(ttypes.InvalidRequest, match="do not match the model"):
        node.train_with_weights(request(dict_to_wire({"W1": np.ones(3)})))
    assert node.weights.runs() == []
    assert node.train_with_weights(request(initial())).outcome == ttypes.UnitOutcome.COMPLETED
    assert node.weights.versions("r") == [4]


def test_weights_in_a_codec_the_run_did_not_ask_for_are_refused():
    sent = {f"{name}#fp16#float64": value.astype(np.float16)
            for name, value in wire_to_dict(initial()).items()}
    with pytest.raises(ttypes.InvalidRequest, match="not asked for"):
        handler().train_with_weights(request(dict_to_wire(sent)))


def test_received_weights_are_kept_as_they_are_and_others_as_copies():
    cache = WeightCache()
    received = {name: np.frombuffer(bytearray(value.tobytes()), value.dtype).reshape(value.shape)
                for name, value in arrays(2.0).items()}
    for value in received.values():
        value.flags.writeable = False  # views of a message: nothing writes them
    assert cache.put("r", 1, "none", received)
    kept = cache.get("r", 1, "none", writable=False)
    assert kept is not None
    assert all(kept[name] is received[name] for name in received)  # a big model once
    writable = arrays(3.0)
    assert cache.put("r", 2, "none", writable)
    copied = cache.get("r", 2, "none", writable=False)
    assert copied is not None and not np.shares_memory(copied["w"], writable["w"])
