"""The round engine's algorithm hooks with in-process nodes: per-unit tensors, results kept
per unit, placement, and affinity to the node that holds a unit's session."""

from __future__ import annotations

import json
import threading

import torch

from tests.inprocess import LocalNode
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.tasks import Task
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.units import UnitSpec
from thrift_trainer.wire.rpc import ConnectionFailed

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
            weights=algorithm.unit_tensors(unit), scheduling_policy=2)

    progress = RunProgress("r", 1, len(units), lambda: [n.summary() for n in nodes])
    engine = RoundEngine("r", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                         progress, threading.Event())
    outcome = engine.run_round(1, units, len(units), build)
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
    kept = {r.unit.unit_id: r.update for r in outcome.results}
    assert list(kept) == [u.unit_id for u in units]  # in unit order
    assert all(update["feedback"].shape == (8, 1, 28, 28) for update in kept.values())
    assert all(int(update["iteration"][0]) == 1 for update in kept.values())
    before = algorithm.initial_weights()
    after = algorithm.aggregate(1, before, outcome.results, outcome.failures)  # one G step
    assert any(not (after[k] == before[k]).all() for k in before)
