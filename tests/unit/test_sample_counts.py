"""Sample counts of results: checked against what each unit holds before they weigh in."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from tests.inprocess import LocalNode
from thrift_trainer.compute_node.faults import corrupt_output
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.tasks import Task, TaskResult
from thrift_trainer.engine.update_filters import DEFAULT_FILTERS, SampleCount, UpdateFilter
from thrift_trainer.training.algorithms.base import combine
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.fl_gan import FLGan
from thrift_trainer.training.algorithms.md_gan import MDGan
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.gan_training import shard_indices, training_size
from thrift_trainer.training.schema import AggregationSettings, defaults
from thrift_trainer.training.units import UnitJob, UnitOutput, UnitSpec
from thrift_trainer.training.update_checks import check_sample_count

LETTERS = DEFAULT_DATA_ROOT / "letters"
MNIST = DEFAULT_DATA_ROOT / "mnist"
DELTA = DeltaAveraging("mlp", {"epochs": 1, "hidden": [8]}, LETTERS)
WEIGHTS = DELTA.initial_weights()


class BogusSamplesNode(LocalNode):
    """Answers with a right update and a wrong sample count."""

    def __init__(self, index: int, num_samples: int) -> None:
        super().__init__(index)
        self.num_samples = num_samples

    def train(self, request: Task) -> TaskResult:
        result = super().train(request)
        result.num_samples = self.num_samples
        return result


def build(unit: UnitSpec, attempt: int) -> Task:
    return Task(
        run_id="r1", round=1, unit_id=unit.unit_id,
        attempt=attempt, algorithm="delta_avg", model="mlp", dataset="letters",
        unit_path=unit.unit_path, config_json=json.dumps(DELTA.config),
        weights=WEIGHTS, scheduling_policy=2)


def run_round(nodes: list[LocalNode], *filters: UpdateFilter) -> tuple:
    progress = RunProgress("r1", 1, 4, lambda: [n.summary() for n in nodes])
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(), progress,
                         threading.Event())
    units = DELTA.plan_round(1)[:4]
    return engine.run_round(1, units, len(units), build, filters or DEFAULT_FILTERS), progress


def honest_average() -> dict[str, np.ndarray]:
    outcome, _ = run_round([LocalNode(0)], SampleCount(DELTA.check_samples))
    return combine(defaults(AggregationSettings), outcome.results)


@pytest.mark.parametrize("num_samples", [0, -3, 10**15])
def test_a_bogus_sample_count_is_refused_and_the_unit_done_elsewhere(num_samples):
    bogus = BogusSamplesNode(0, num_samples)
    outcome, progress = run_round([bogus, LocalNode(1)], SampleCount(DELTA.check_samples))
    assert outcome.completed == 4 and not outcome.discarded
    assert bogus.stats.failed >= 1 and bogus.stats.accepted == 0
    assert progress.snapshot().failed == bogus.stats.failed
    expected = honest_average()
    for name, value in combine(defaults(AggregationSettings), outcome.results).items():
        np.testing.assert_allclose(value, expected[name])


def test_without_the_algorithm_a_count_below_one_is_still_refused():
    bogus = BogusSamplesNode(0, 0)
    outcome, _ = run_round([bogus, LocalNode(1)])  # the engine's default filters only
    assert outcome.completed == 4 and bogus.stats.failed >= 1


def test_the_message_names_the_count_and_the_range():
    with pytest.raises(ValueError, match=r"num_samples 0 is out of range 1\.\.1500"):
        check_sample_count(0, 1500)
    with pytest.raises(ValueError, match=r"num_samples 1000000000000000 is out of range "
                                         r"1\.\.1500"):
        check_sample_count(10**15, 1500)
    check_sample_count(1500, 1500)
    check_sample_count(7, None)


def test_delta_avg_units_hold_the_rows_of_their_files():
    for unit in DELTA.plan_round(1):
        rows = len(load_letters(LETTERS / unit.unit_path)[1])
        assert DELTA.unit_samples(unit) == rows
        output = DELTA.run_unit(UnitJob("r1", 1, unit, "mlp", DELTA.config, WEIGHTS), LETTERS)
        DELTA.check_samples(unit, output.num_samples)  # what an honest node sends passes


def test_sync_sgd_units_hold_their_index_range():
    algorithm = SyncSGD("mlp", {"images_per_work_unit": 300, "hidden": [8]}, LETTERS)
    weights = algorithm.initial_weights()
    for unit in algorithm.plan_round(1):
        output = SyncSGD.run_unit(UnitJob("r1", 1, unit, "mlp", algorithm.config, weights),
                                  LETTERS)
        assert algorithm.unit_samples(unit) == output.num_samples == 300


def test_gan_units_hold_their_shard_or_batch():
    fl = FLGan("dcgan28-tiny", {"workers": 3, "batch_size": 64, "seed": 2}, MNIST)
    size = training_size(MNIST)
    for slot, unit in enumerate(fl.plan_round(1)):
        assert fl.unit_samples(unit) == len(shard_indices(size, slot, 3, 2))
    md = MDGan("dcgan28-tiny", {"workers": 3, "batch_size": 16}, MNIST)
    assert {md.unit_samples(unit) for unit in md.plan_round(1)} == {16}


def test_the_fault_injection_spoils_only_the_count():
    output = UnitOutput(update={"w": np.ones(2)}, num_samples=10, loss=0.5, error=0.1)
    assert corrupt_output(output, "zero-samples").num_samples == 0
    assert corrupt_output(output, "huge-samples").num_samples == 10**15
    assert corrupt_output(output, "nan").num_samples == 10
    assert np.isnan(corrupt_output(output, "nan").update["w"]).all()

