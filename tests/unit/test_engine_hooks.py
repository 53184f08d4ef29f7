"""The round engine's algorithm hooks with in-process nodes: per-unit tensors, updates kept
per unit, placement, and affinity to the node that holds a unit's session."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from coordinator.policies import RoundRobinPolicy
from coordinator.progress import RunProgress
from coordinator.round_engine import EngineSettings, RoundEngine
from coordinator.tasks import Task
from tests.inprocess import LocalNode
from training.algorithms.base import PerUnitUpdates, UnitSpec, per_unit
from training.algorithms.md_gan import MDGan
from training.datapaths import DEFAULT_DATA_ROOT
from wire.rpc import ConnectionFailed
from wire.tensor_codec import dict_to_wire

torch.set_num_threads(1)

CONFIG = {"batch_size": 8, "workers": 4, "k": 2, "batchnorm": False}


def md_round(nodes: list[LocalNode], preferred: dict[int, str]):
    algorithm = MDGan("dcgan28-tiny", CONFIG, DEFAULT_DATA_ROOT / "mnist")
    algorithm.placement = dict(preferred)
    units = algorithm.plan_round(1)

    def build(unit: UnitSpec, attempt: int) -> Task:
        return Task(
            run_id="r", round=1, unit_id=unit.unit_id,
            attempt=attempt, algorithm="md_gan", model="dcgan28-tiny", dataset="mnist",
            unit_path=unit.unit_path, config_json=json.dumps(algorithm.config),
            weights=dict_to_wire(algorithm.unit_tensors(unit)), scheduling_policy=2)

    progress = RunProgress("r", 1, len(units), lambda: [n.summary() for n in nodes])
    engine = RoundEngine("r", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                         progress, threading.Event())
    outcome = engine.run_round(1, units, len(units), build,
                               aggregate=algorithm.aggregator(units, False))
    return algorithm, units, outcome


def test_units_go_first_to_the_node_holding_their_session() -> None:
    nodes = [LocalNode(0), LocalNode(1)]
    _, units, outcome = md_round(nodes, {slot: nodes[1].name for slot in range(4)})
    assert outcome.placement == {u.unit_id: nodes[1].name for u in units}
    assert nodes[0].calls == 0
    assert len(nodes[1].handler.sessions) == 4


def test_a_unit_falls_back_to_any_node_when_its_preferred_node_is_gone() -> None:
    dead = LocalNode(0, fail_with=ConnectionFailed("cannot connect to local:10000: refused"))
    nodes = [dead, LocalNode(1)]
    _, units, outcome = md_round(nodes, {slot: dead.name for slot in range(4)})
    assert outcome.completed == 4
    assert outcome.placement == {u.unit_id: nodes[1].name for u in units}


def test_each_unit_carries_its_own_tensors_and_its_update_is_kept_by_unit_id() -> None:
    nodes = [LocalNode(0), LocalNode(1)]
    algorithm, units, outcome = md_round(nodes, {})
    kept = per_unit(outcome.average)
    assert sorted(kept) == sorted(u.unit_id for u in units)
    assert all(update["feedback"].shape == (8, 1, 28, 28) for update in kept.values())
    assert all(int(update["iteration"][0]) == 1 for update in kept.values())
    algorithm.apply(algorithm.initial_weights(), outcome.average)  # one G step from them


def test_per_unit_updates_round_trip_and_refuse_ambiguous_ids() -> None:
    kept = PerUnitUpdates([UnitSpec("a", "f"), UnitSpec("b", "f")])
    kept.add(1, {"x": np.ones(2)}, 3)
    kept.add(0, {"x": np.zeros(2), "y": np.ones(1)}, 3)
    assert list(kept.result()) == ["a/x", "a/y", "b/x"]
    assert kept.count == 2
    assert sorted(per_unit(kept.result())) == ["a", "b"]
    with pytest.raises(ValueError, match="must not hold"):
        PerUnitUpdates([UnitSpec("a/b", "f")])
    with pytest.raises(ValueError, match="no update"):
        PerUnitUpdates([UnitSpec("a", "f")]).result()
    with pytest.raises(ValueError, match="positive sample count"):
        kept.add(0, {"x": np.ones(2)}, 0)
