"""The per-unit cost of a node's config path: parsing and checking a unit's run config.

A node's unit runner is swapped for one that only takes the unit's checked config as an
algorithm's `run_unit` does (`Algorithm.unit_config`), so what is timed is the request's
way through the node without its maths: the spec, the run's fit, the algorithm's checks,
the weights' decoding (the same small tensors in every variant). Two units: a letters unit
(delta_avg, the numpy MLP) and a tiny torch unit (sync_sgd on mlp_classifier, which also
carries the coordinator's fingerprints for the node to check itself against).

    python bench/node_config_path.py [--units 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from thrift_trainer.compute_node.handler import ComputeNodeHandler  # noqa: E402
from thrift_trainer.compute_node.load import LoadSimulator  # noqa: E402
from thrift_trainer.training.algorithms import get_algorithm  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.models import mlp  # noqa: E402
from thrift_trainer.training.run_check import run_facts  # noqa: E402
from thrift_trainer.training.spec import RunSpec  # noqa: E402
from thrift_trainer.training.units import UnitOutput  # noqa: E402
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes  # noqa: E402
from thrift_trainer.wire.tensor_codec import dict_to_wire  # noqa: E402


def _config_only(algorithm, job, data_dir) -> UnitOutput:
    """A unit runner that takes the unit's config as `run_unit` does, and no maths."""
    unit_config = getattr(algorithm, "unit_config", None)
    if unit_config is not None:
        unit_config(job)
    else:  # the code before a node kept its runs' checked configs
        algorithm.check_config(job.model, job.config)
    return UnitOutput(update={}, num_samples=1, loss=0.0, error=0.0)


def letters_request() -> ttypes.WorkRequest:
    weights = mlp.init_params(mlp.MLPSpec(hidden=(20,)))
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u1", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters",
        unit_path="train_letters1.txt", config_json=json.dumps({"epochs": 15, "eta": 0.0001,
                                                               "hidden": [20]}),
        weights=dict_to_wire(weights), scheduling_policy=2)


def torch_request() -> ttypes.WorkRequest:
    own = {"images_per_work_unit": 50, "num_workunits_per_update": 2,
           "units_per_iteration": 2, "model": {"args": {"hidden": [8]}},
           "data": {"format": "letters"}}
    spec = RunSpec.parse("sync_sgd", "mlp_classifier", "letters", json.dumps(own))
    facts = run_facts(spec, DEFAULT_DATA_ROOT / "letters")
    spec = RunSpec.parse("sync_sgd", "mlp_classifier", "letters",
                         json.dumps({**own, "expect": facts.expectation()}))
    algorithm = get_algorithm("sync_sgd")("mlp_classifier", spec.algorithm_config(),
                                           DEFAULT_DATA_ROOT / "letters", "letters")
    config = algorithm.check_config("mlp_classifier", spec.algorithm_config())
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="t", round=1, unit_id="unit0-0-50",
        attempt=1, algorithm="sync_sgd", model="mlp_classifier", dataset="letters",
        unit_path="", index_start=0, index_stop=50,
        config_json=spec.to_config_json(config),
        weights=dict_to_wire(algorithm.initial_weights()), scheduling_policy=2)


def per_unit_us(request: ttypes.WorkRequest, units: int) -> float:
    node = ComputeNodeHandler("bench", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))
    node.unit_runner = _config_only
    result = node.train_with_weights(request)  # the run's first unit: parsed and checked
    assert result.accepted, result.message
    began = time.perf_counter()
    for attempt in range(units):
        request.attempt = attempt + 2
        node.train_with_weights(request)
    return (time.perf_counter() - began) / units * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=2000)
    args = parser.parse_args()
    for name, build in (("letters unit (delta_avg, mlp)", letters_request),
                        ("torch unit (sync_sgd, mlp_classifier)", torch_request)):
        request = build()
        best = min(per_unit_us(request, args.units) for _ in range(3))
        print(f"{name}: {best:.0f} us per unit on the node's path without maths")


if __name__ == "__main__":
    main()
