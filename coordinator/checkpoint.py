"""A run's checkpoint and request on disk, so a killed coordinator can resume the run.

The checkpoint (`checkpoint.npz`, written atomically by `save_model`) holds the weights
after a round, the algorithm's optimizer state, the scheduling policy's random state and
the round number; `request.json` holds the TrainRequest the run was started with. Unit
states live in the run store. Together they are everything the next rounds depend on,
so a resumed run in deterministic mode ends with the same bits as an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.algorithms.base import Weights
from training.model_file import ModelFileError, load_model, save_model
from wire.generated import ttypes

CHECKPOINT_FILE = "checkpoint.npz"
REQUEST_FILE = "request.json"
METRICS_FILE = "metrics.jsonl"
OPTIMIZER_PREFIX = "optimizer."
REQUEST_FIELDS = ("run_id", "algorithm", "model", "dataset", "rounds", "config_json",
                  "outputs_json")


class CheckpointError(Exception):
    """A run that cannot be resumed; the message says why."""


@dataclass
class Checkpoint:
    round: int
    weights: Weights
    optimizer: dict[str, np.ndarray]
    policy_rng: Any  # random.Random.getstate() of the scheduling policy, or None


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint, description: dict[str, Any]) -> Path:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    arrays = {**checkpoint.weights,
              **{OPTIMIZER_PREFIX + k: v for k, v in checkpoint.optimizer.items()}}
    meta = {**description, "round": checkpoint.round, "policy_rng": checkpoint.policy_rng}
    return save_model(run_dir / CHECKPOINT_FILE, arrays, meta)


def load_checkpoint(run_dir: Path) -> Checkpoint:
    try:
        arrays, meta = load_model(run_dir / CHECKPOINT_FILE)
    except ModelFileError as exc:
        raise CheckpointError(f"no usable checkpoint in {run_dir}: {exc}") from None
    optimizer = {k[len(OPTIMIZER_PREFIX):]: v for k, v in arrays.items()
                 if k.startswith(OPTIMIZER_PREFIX)}
    weights = {k: v for k, v in arrays.items() if not k.startswith(OPTIMIZER_PREFIX)}
    return Checkpoint(int(meta["round"]), weights, optimizer, _rng_state(meta.get("policy_rng")))


def _rng_state(saved: Any) -> Any:
    """JSON turned getstate()'s tuples into lists; setstate wants them back."""
    if saved is None:
        return None
    version, internal, gauss = saved
    return version, tuple(internal), gauss


def save_request(run_dir: Path, request: ttypes.TrainRequest) -> None:
    data = {name: getattr(request, name) for name in REQUEST_FIELDS}
    (run_dir / REQUEST_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_request(run_dir: Path, protocol_version: int) -> ttypes.TrainRequest:
    path = run_dir / REQUEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ttypes.TrainRequest(protocol_version=protocol_version,
                                   **{name: data[name] for name in REQUEST_FIELDS})
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: is {run_dir.name} a run of this "
                              "coordinator's --run-dir?") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc}") from None


def metrics_until(run_dir: Path, last_round: int) -> list[dict[str, Any]]:
    """The metrics rows of rounds up to `last_round`; later rows (rounds that will be
    done again) are dropped from the file, so each round appears once."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    kept = [row for row in rows if row.get("round", 0) <= last_round]
    path.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    return kept


def metrics_of(row: dict[str, Any]) -> ttypes.RoundMetrics:
    """A RoundMetrics back from a metrics.jsonl row."""
    core = ("round", "validation_error", "validation_loss", "train_loss", "seconds")
    scores = {k: float(v) for k, v in row.items()
              if k not in core and k != "discarded" and isinstance(v, (int, float))}
    return ttypes.RoundMetrics(round=row["round"], validation_error=row["validation_error"],
                               validation_loss=row["validation_loss"],
                               train_loss=row["train_loss"], seconds=row["seconds"],
                               scores=scores or None)
