"""Federated evaluation's units in process: a node's service scores the weights it is sent
on the client's validation part and sends no update, a client's training unit reports its
loss before training, a malformed kind is refused in one line, and the coordinator's
evaluation engine sends each unit only to a holder of its client."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from tests.inprocess import LocalNode
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.coordinator.client_eval import evaluate_clients, evaluation_engine
from thrift_trainer.engine.policies import RoundRobinPolicy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
from thrift_trainer.engine.tasks import Task
from thrift_trainer.training.algorithms import torch_model
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.clients.data_parts import parts_of, validation_parts_of
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import modules
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.units import UnitSpec
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire

OVERRIDES = ["run.model=mlp_classifier", "run.dataset=letters", "data.format=letters",
             "run.algorithm=delta_avg", "delta_avg.epochs=1", "delta_avg.batch_size=50",
             "clients.count=6", "clients.validation_fraction=0.25", "clients.eval_every=1"]
CLIENT = 4


@pytest.fixture(scope="module")
def run() -> dict:
    """The run's config as a unit carries it, its setup, and its initial weights."""
    spec = load_run_config(None, OVERRIDES).to_spec()
    algorithm = DeltaAveraging("mlp_classifier", spec.algorithm_config(),
                               DEFAULT_DATA_ROOT / "letters", "letters")
    setup = torch_model.setup_of("mlp_classifier", algorithm.config, "letters",
                                 DEFAULT_DATA_ROOT / "letters")
    return {"config_json": spec.to_config_json(algorithm.config), "spec": spec,
            "config": algorithm.config, "setup": setup,
            "weights": algorithm.initial_weights(), "algorithm": algorithm}


def _request(run: dict, **changes) -> ttypes.WorkRequest:
    fields = dict(protocol_version=PROTOCOL_VERSION, run_id="r", round=1,
                  unit_id=f"client{CLIENT}", attempt=1, algorithm="delta_avg",
                  model="mlp_classifier", dataset="letters", unit_path="",
                  config_json=run["config_json"], weights=dict_to_wire(run["weights"]),
                  scheduling_policy=2, client=f"client{CLIENT}")
    fields.update(changes)
    return ttypes.WorkRequest(**fields)


def _handler() -> ComputeNodeHandler:
    return ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))


def _scored(run: dict, examples: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean loss) of the initial weights on training-part ``examples``."""
    module = run["setup"].build()
    modules.load_arrays(module, run["weights"])
    module.eval()
    inputs, targets = run["setup"].data.train.take(examples)
    with torch.no_grad():
        outputs = module(inputs)
        loss = torch.nn.functional.cross_entropy(outputs, targets)
    return float((outputs.argmax(dim=1) == targets).double().mean()), float(loss)


def test_an_evaluation_unit_scores_the_clients_validation_part_and_sends_no_update(run):
    result = _handler().train_with_weights(_request(run, unit_id=f"eval-client{CLIENT}",
                                                    kind="evaluate"))
    assert result.outcome == ttypes.UnitOutcome.COMPLETED and result.update == []
    held = validation_parts_of(run["setup"], run["spec"].clients,
                               run["config"]["seed"])[CLIENT]
    assert result.num_samples == len(held) > 0
    accuracy, loss = _scored(run, held)
    assert 1.0 - result.error == pytest.approx(accuracy, abs=1e-6)
    assert result.loss == pytest.approx(loss, rel=1e-5)


def test_a_clients_training_unit_reports_its_loss_before_training(run):
    result = _handler().train_with_weights(_request(run))
    assert result.outcome == ttypes.UnitOutcome.COMPLETED and result.update
    train = parts_of(run["setup"], run["spec"].clients, run["config"]["seed"])[0][CLIENT]
    assert result.num_samples == len(train)
    assert result.loss_before == pytest.approx(_scored(run, train)[1], rel=1e-5)
    assert math.isfinite(result.loss) and result.loss != result.loss_before


def test_a_unit_without_a_client_measures_no_loss_before(run):
    plain = load_run_config(None, OVERRIDES[:6]).to_spec()
    config_json = plain.to_config_json(DeltaAveraging.check_config(
        "mlp_classifier", plain.algorithm_config()))
    result = _handler().train_with_weights(_request(
        run, config_json=config_json, client=None, unit_id="shard0-0-100", index_start=0,
        index_stop=100))
    assert result.outcome == ttypes.UnitOutcome.COMPLETED and result.loss_before is None


@pytest.mark.parametrize("changes, message", [
    ({"kind": "guess"}, "unknown kind of unit 'guess'"),
    ({"kind": "evaluate", "client": None}, "names the client"),
])
def test_a_malformed_kind_is_refused_in_one_line(run, changes, message):
    with pytest.raises(ttypes.InvalidRequest, match=message):
        _handler().train_with_weights(_request(run, **changes))


class _Tasks:
    """The run's tasks as `RunTasks.task` builds them, for the in-process engine."""

    def __init__(self, run: dict) -> None:
        self.run = run

    def task(self, round_index: int, unit: UnitSpec, attempt: int, weights: dict,
             model_version: int | None = None) -> Task:
        return Task(run_id="r", round=round_index, unit_id=unit.unit_id, attempt=attempt,
                    algorithm="delta_avg", model="mlp_classifier", dataset="letters",
                    unit_path="", config_json=self.run["config_json"], weights=weights,
                    scheduling_policy=2, model_version=model_version, client=unit.client,
                    kind=unit.kind)


def test_evaluation_units_go_to_their_holders_and_a_client_without_one_is_missed(run):
    nodes = [LocalNode(0), LocalNode(1)]
    for node, held in zip(nodes, ({"client1", "client4"}, {"client2"}), strict=True):
        node.clients, node.clients_checked = frozenset(held), True
    engine = RoundEngine("r", nodes, RoundRobinPolicy(), EngineSettings(),
                         RunProgress("r", 1, 6, lambda: []), threading.Event())
    units = run["algorithm"].evaluation_units(1, 1)  # every client, after the last round
    assert [u.unit_id for u in units] == [f"eval-client{k}" for k in range(6)]
    done = evaluate_clients(evaluation_engine(engine), _Tasks(run), 1, units,
                            run["weights"], accuracy=True)
    scored = {row["client"]: row["node"] for row in done.rows if "node" in row}
    assert scored == {"client1": nodes[0].name, "client4": nodes[0].name,
                      "client2": nodes[1].name}
    assert sorted(row["client"] for row in done.rows if "dropped" in row) == \
        ["client0", "client3", "client5"]
    assert done.figures["clients_evaluated"] == 3 and done.figures["clients_eval_missed"] == 3
    assert engine.progress.units_done == 0  # the run's counts are the training units'
