"""The standalone baseline: an algorithm's own maths in one process, no network.

Each round takes the algorithm's planned units, computes them in turn with the node half
and combines them with the same weighted average and update as the coordinator. With
one unit per round of the global batch's size this is plain single-process training on
that batch, which is what distributed runs are compared against. The algorithm's hooks
apply as on the coordinator: a unit carries `unit_tensors` when the algorithm sends its
own, results go through its `aggregate`, and algorithms that keep node sessions get the
``sessions`` store given here (one store: every unit runs on this one "node").

A plain single-process GAN (batch b, or N x b) is in training/baselines/standalone_gan.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.units import UnitJob, UnitResult, Weights


def train_in_process(algorithm: Algorithm, rounds: int,
                     on_round: Callable[[int, Weights], None] | None = None,
                     sessions: Any = None, weights: Weights | None = None,
                     first_round: int = 1) -> Weights:
    """Run rounds ``first_round`` to ``rounds`` of `algorithm` here, from ``weights``
    (default: its initial ones; a later first round goes on from a saved state, whose
    algorithm state the caller has loaded); returns the final weights. ``sessions`` is a
    node session store (compute_node/sessions.py) for algorithms that need one."""
    weights = algorithm.initial_weights() if weights is None else weights
    dataset_dir = Path(algorithm.dataset_dir)
    for round_index in range(first_round, rounds + 1):
        planned = algorithm.plan_round(round_index)
        units = planned[: algorithm.quorum(len(planned))]  # the first K, as if they won
        results = []
        for unit in units:
            tensors = algorithm.unit_tensors(unit)
            job = UnitJob("standalone", round_index, unit, algorithm.model, algorithm.config,
                          weights if tensors is None else tensors, sessions=sessions,
                          dataset=algorithm.dataset)
            output = type(algorithm).run_unit(job, dataset_dir)
            results.append(UnitResult(unit, output.update, output.num_samples, output.loss))
        weights = algorithm.aggregate(round_index, weights, results, [])
        if on_round is not None:
            on_round(round_index, weights)
    return weights
