"""What a relay checks of its members' results: the coordinator's checks, with the tensors to
expect sent along with each unit, and what it reports of a member it benched."""

from __future__ import annotations

import json

import numpy as np
import pytest

from thrift_trainer.client.display import refused_lines
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.engine.nodes.thrift_client import work_request
from thrift_trainer.engine.tasks import Task
from thrift_trainer.engine.update_filters import (
    Candidate,
    NormLimit,
    RoundView,
    decoded,
    relayed_filters,
)
from thrift_trainer.engine.update_norms import RecentNorms
from thrift_trainer.training.compression import compress
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.training.units import UnitOutput, UnitSpec
from thrift_trainer.training.update_checks import specs_of
from thrift_trainer.wire.tensor_codec import specs_from_wire, specs_to_wire

WEIGHTS = {"W": np.ones((4, 3)), "b": np.zeros(3)}
SLICE = UnitSpec("u1~r0", "", 0, 100)  # 100 examples
VIEW = RoundView(0.0, lambda: True)


def check(update: dict, codec: str = "none", samples: int = 50,
          expected: dict | None = None) -> None:
    """The relay's filters over one member result, as the relay's engine runs them."""
    filters = relayed_filters(specs_of(WEIGHTS) if expected is None else expected, WEIGHTS,
                              codec, NormLimit(10.0))
    for update_filter in filters:
        update_filter.start_round(2, 2)
    plain = decoded(filters, update)
    for update_filter in filters:
        update_filter.check(Candidate(SLICE, "member", plain, samples), VIEW)


def test_a_sound_result_passes_compressed_or_not() -> None:
    check(dict(WEIGHTS))
    check(compress(WEIGHTS, "int8")[0], codec="int8")


@pytest.mark.parametrize("update, codec, samples, reason", [
    ({"W": np.full((4, 3), np.nan), "b": np.zeros(3)}, "none", 50, "NaN"),
    ({"W": np.ones((3, 4)), "b": np.zeros(3)}, "none", 50, "has shape"),
    ({"W": np.ones((4, 3))}, "none", 50, "missing"),
    (compress(WEIGHTS, "int8")[0], "none", 50, "not asked for"),
    (dict(WEIGHTS), "none", 101, "out of range 1..100"),
    (dict(WEIGHTS), "none", 0, "out of range"),
])
def test_the_coordinators_refusals_are_the_relays(update: dict, codec: str, samples: int,
                                                  reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check(update, codec, samples)


def test_without_the_tensors_to_expect_values_are_still_checked() -> None:
    filters = relayed_filters(None, WEIGHTS, "none", NormLimit(10.0))
    with pytest.raises(ValueError, match="NaN"):
        for update_filter in filters:
            update_filter.check(Candidate(SLICE, "m", {"x": np.full(2, np.inf)}, 5), VIEW)


def test_the_guards_of_a_runs_units_share_its_recent_norms() -> None:
    recent = RecentNorms()
    first, second = NormLimit(10.0, recent), NormLimit(10.0, recent)
    for _ in range(8):  # the first updates of the run set the scale, through either
        first.guard.check({"w": np.ones(4)})
    assert recent.median(8) == 2.0
    second.guard.start_round(1, 1)
    with pytest.raises(ValueError, match="median of recent"):
        second.guard.check({"w": np.full(4, 100.0)})


def test_the_tensors_to_expect_travel_with_the_unit_to_the_node() -> None:
    specs = specs_of(mlp.init_params(mlp.MLPSpec(hidden=(20,)), seed=3))
    assert specs_from_wire(specs_to_wire(specs)) == {
        name: (tuple(shape), dtype) for name, (shape, dtype) in specs.items()}
    seen: list = []

    def runner(algorithm, job, data_dir) -> UnitOutput:
        seen.append(job.expected_update)
        return UnitOutput(update={}, num_samples=1, loss=0.0, error=0.0)

    node = ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))
    node.unit_runner = runner
    task = Task(run_id="r", round=1, unit_id="u1", attempt=1, algorithm="delta_avg",
                model="mlp", dataset="letters", unit_path="train_letters1.txt",
                config_json=json.dumps({"hidden": [20]}),
                weights=mlp.init_params(mlp.MLPSpec(hidden=(20,)), seed=3),
                scheduling_policy=2, expected_update=specs)
    node.train_with_weights(work_request(task))
    assert seen == [specs_from_wire(specs_to_wire(specs))]


def test_the_summary_names_each_benched_node_of_the_tree_with_its_reason() -> None:
    nodes = [{"node": "relay", "refused": None, "members": [
        {"node": "a", "refused": None, "members": []},
        {"node": "b", "refused": "tensor 'W' holds NaN or infinite values", "members": []}]}]
    assert refused_lines(nodes) == [
        "node b was benched for a result refused: tensor 'W' holds NaN or infinite values"]
