"""Federated evaluation: the global model scored on the clients' own validation parts.

Every ``clients.eval_every`` rounds (and after the last), once the round's update is
applied (in the asynchronous modes: once a round's last version is made; the stream's
workers go on meanwhile, and the evaluation's units carry that version's number), the
coordinator sends an evaluation unit (kind "evaluate", id ``eval-<client>``) for each of a
seeded sample of clients (``clients.eval_per_round``) to a node that holds that client.
The node scores the weights it is sent on the client's validation part and answers with
the loss, the run's metric and the examples; nothing is trained, and no answer is
averaged into the model.

The units run in an engine of their own (`evaluation_engine`): the run's nodes, policy,
retries and drop-outs (a unit goes only to holders; a client without a live holder is
skipped and counted), but no run-store ledger and no share of the run's unit counts: an
evaluation is no unit of training, and a resume must never take one up as one. Its
figures join the round's scores: ``federated_val_loss`` / ``_error`` / ``_accuracy``
weighted by each client's validation examples, and the fairness figures over the
clients' validation accuracy (its mean, the mean of the worst 10 % and the spread).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from thrift_trainer.coordinator.client_files import EVAL_KIND, client_order
from thrift_trainer.coordinator.run_tasks import RunTasks
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import RoundEngine, RoundFailed
from thrift_trainer.engine.round_state import RoundOutcome
from thrift_trainer.engine.tasks import Task, Tensors
from thrift_trainer.training.units import UnitSpec

log = logging.getLogger("coordinator.run")

WORST_SHARE = 0.1  # the fairness figures' "worst 10 %"


@dataclass(frozen=True)
class Evaluated:
    """One federated evaluation: its clients.jsonl lines and its figures for the scores."""

    rows: list[dict[str, Any]]
    figures: dict[str, float]


def evaluation_engine(engine: RoundEngine) -> RoundEngine:
    """An engine beside the run's, for evaluation units: the same nodes, policy, cancel
    flag and cancels; no ledger, counts of its own, no backup attempts (an evaluation is
    short, and a duplicate would only score the same examples twice)."""
    progress = RunProgress(engine.run_id, 1, 0, lambda: [])
    return RoundEngine(engine.run_id, engine.nodes, engine.policy,
                       replace(engine.settings, speculation=False, deterministic=False),
                       progress, engine.cancelled, UnitLedger(None, engine.run_id),
                       engine.cancels)


def evaluate_clients(engine: RoundEngine, tasks: RunTasks, round_index: int,
                     units: list[UnitSpec], payload: Tensors, accuracy: bool,
                     version: int | None = None) -> Evaluated:
    """Run ``units`` (evaluation units of round ``round_index``) with the weights as sent,
    ``payload`` (model ``version``: by default ``round_index``, as in sync rounds; an
    asynchronous round's last version); every unit answers, drops out (no live holder) or
    fails. ``accuracy``: the metric is an error rate (1 - it is reported too)."""
    model_version = round_index if version is None else version

    def build(unit: UnitSpec, attempt: int) -> Task:
        return tasks.task(round_index, unit, attempt, payload, model_version=model_version)

    try:
        outcome = engine.run_round(round_index, units, len(units), build, filters=[])
    except RoundFailed as exc:  # training goes on: the evaluation says it failed
        log.warning("round %d: federated evaluation failed: %s", round_index, exc)
        rows = [{"round": round_index, "client": u.client, "kind": EVAL_KIND,
                 "failed": str(exc)} for u in units]
        return Evaluated(rows, {"eval_round": round_index, "clients_evaluated": 0,
                                "clients_eval_missed": len(units)})
    rows = eval_rows(round_index, outcome, accuracy)
    figures = {"eval_round": round_index, **eval_figures(rows)}
    log.info("round %d: federated evaluation of %d clients%s", round_index,
             figures.get("clients_evaluated", 0),
             f", validation loss {figures['federated_val_loss']:.4f}"
             if "federated_val_loss" in figures else "")
    return Evaluated(rows, figures)


def eval_rows(round_index: int, outcome: RoundOutcome, accuracy: bool) -> list[dict[str, Any]]:
    """The clients.jsonl lines of one evaluation, in client order."""
    rows: list[dict[str, Any]] = []
    for result in outcome.results:
        row = {"round": round_index, "client": result.unit.client, "kind": EVAL_KIND,
               "examples": result.num_samples, "val_loss": _finite(result.loss),
               "val_error": _finite(result.error), "node": result.node}
        if accuracy:
            row["val_accuracy"] = None if row["val_error"] is None else 1.0 - result.error
        rows.append(row)
    for key, settled in (("failed", outcome.failures), ("dropped", outcome.dropped)):
        rows += [{"round": round_index, "client": f.unit.client, "kind": EVAL_KIND,
                  key: f.reason} for f in settled]
    return sorted(rows, key=lambda row: client_order(row["client"]))


def eval_figures(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Over one evaluation's lines: the clients scored and missed, the validation loss,
    metric and accuracy weighted by each client's examples (``federated_val_*``), and the
    fairness figures over the clients' accuracy (or, without one, their metric, where
    the worst is the highest)."""
    scored = [row for row in rows if "node" in row and row.get("val_loss") is not None]
    figures: dict[str, float] = {"clients_evaluated": len(scored),
                                 "clients_eval_missed": len(rows) - len(scored)}
    weights = np.array([row["examples"] for row in scored], dtype=np.float64)
    if not scored or weights.sum() <= 0:
        return figures
    for key in ("val_loss", "val_error", "val_accuracy"):
        values = [row.get(key) for row in scored]
        if all(value is not None for value in values):
            figures[f"federated_{key}"] = float(np.dot(weights, values) / weights.sum())
    name = "val_accuracy" if "federated_val_accuracy" in figures else "val_error"
    if f"federated_{name}" in figures:
        figures.update(_fairness([row[name] for row in scored], f"client_{name}",
                                 worst_low=name == "val_accuracy"))
    return figures


def _fairness(values: list[float], prefix: str, worst_low: bool) -> dict[str, float]:
    """Mean, mean of the worst 10 % (at least one client) and standard deviation."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    if not worst_low:
        ordered = ordered[::-1]
    worst = ordered[:max(1, math.ceil(WORST_SHARE * ordered.size))]
    return {f"{prefix}_mean": float(ordered.mean()), f"{prefix}_worst10": float(worst.mean()),
            f"{prefix}_std": float(ordered.std())}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
