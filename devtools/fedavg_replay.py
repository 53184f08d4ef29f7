"""FedAvg with clients computed in one process, to compare a distributed run with.

The run's config is built from the client's ``--set`` items as the coordinator builds it;
each round's clients train from the round's weights through delta_avg's node half
(`DeltaAveraging.run_unit`), on the folder of each one's data, and the round's results go
through the algorithm's own aggregation (example-weighted FedAvg, or DP-FedAvg's noised
mean with a ``privacy`` section, whose noise is keyed by the run's secret noise key, read
from its checkpoint with coordinator/checkpoint.py's `noise_key`). The end-to-end tests
compare runs through real processes with `replay`; bench/privacy_costs.py trains with
`train_round` and aggregates itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devtools.local_cluster import REPO

LETTERS = REPO / "data" / "letters"
MODEL = "mlp_classifier"

Weights = dict[str, np.ndarray]
ClientsOf = Callable[[int], list[tuple[str, Path]]]


def run_config(overrides: Sequence[str]) -> dict[str, Any]:
    """The algorithm's config a request with ``overrides`` ("key=value" items) carries."""
    from thrift_trainer.training.run_config import load_run_config

    return load_run_config(None, list(overrides)).to_spec().algorithm_config()


def algorithm_for(config: dict[str, Any], data_root: Path = LETTERS,
                  announced: dict[str, int] | None = None,
                  noise_key: bytes | None = None) -> Any:
    """The run's `DeltaAveraging` (the coordinator's half) of ``config`` on ``data_root``;
    ``announced``: node-resident clients' sizes, as their nodes announce them;
    ``noise_key``: a private run's, which its noise and draws are keyed by."""
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging

    algorithm = DeltaAveraging(MODEL, config, data_root, "letters")
    if noise_key is not None:
        algorithm.use_noise_key(noise_key)
    if announced is not None:
        algorithm.take_clients(announced, {})
    return algorithm


def train_round(config: dict[str, Any], round_index: int, weights: Weights,
                clients: Sequence[tuple[str, Path]]) -> list[Any]:
    """Each of ``clients`` (name, data folder) trained from ``weights`` as a node trains its
    unit of ``round_index`` under ``config``: the round's `UnitResult`s, in the order
    given."""
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
    from thrift_trainer.training.units import UnitJob, UnitResult, UnitSpec

    checked = DeltaAveraging.check_config(MODEL, config)
    results = []
    for client, data in clients:
        unit = UnitSpec(unit_id=client, unit_path="", client=client)
        job = UnitJob("replay", round_index, unit, MODEL, config,
                      {k: v.copy() for k, v in weights.items()}, dataset="letters",
                      checked_config=checked)
        output = DeltaAveraging.run_unit(job, data)
        results.append(UnitResult(unit, output.update, output.num_samples, output.loss))
    return results


def replay(overrides: Sequence[str], rounds: int, clients_of: ClientsOf,
           announced: dict[str, int] | None = None,
           watch: Callable[[int, Any, list], None] | None = None,
           noise_key: bytes | None = None) -> Weights:
    """FedAvg in this process: in each round, the clients ``clients_of(round)`` names
    (with the folder of each one's data) trained from the round's weights, their results
    aggregated by the run's algorithm (a private run's with its ``noise_key``); the final
    weights. ``watch`` is called after each round with its index, the algorithm and the
    round's results."""
    config = run_config(overrides)
    algorithm = algorithm_for(config, announced=announced, noise_key=noise_key)
    weights = algorithm.initial_weights()
    for round_index in range(1, rounds + 1):
        results = train_round(config, round_index, weights, clients_of(round_index))
        weights = algorithm.aggregate(round_index, weights, results, [])
        if watch is not None:
            watch(round_index, algorithm, results)
    return weights
