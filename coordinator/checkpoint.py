"""A run's checkpoint and request on disk, so a killed coordinator can resume the run.

The checkpoint (`checkpoint.npz`, written atomically by `save_model`) holds the weights
after a round, the algorithm's optimizer state, the scheduling policy's random state, the
round number and, in the asynchronous modes, where the passes over the data stood (a
private run's state includes its secret noise key: the file is as sensitive as the
clients' updates); `request.json` holds the TrainRequest the run was started with.
Unit states live in the run store. Together they are everything the next rounds depend
on, so a resumed run in deterministic mode ends with the same bits as an uninterrupted
one.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.engine.records import RoundMetrics
from thrift_trainer.training.outputs.model_file import (
    OPTIMIZER_PREFIX,
    ModelFileError,
    load_model,
    save_model,
    without_optimizer,
)
from thrift_trainer.training.outputs.plots import metrics_line
from thrift_trainer.training.privacy import noise_key as noise_keys
from thrift_trainer.training.units import Weights

CHECKPOINT_FILE = "checkpoint.npz"
REQUEST_FILE = "request.json"
METRICS_FILE = "metrics.jsonl"
TRAFFIC_KEYS = ("bytes_down", "bytes_up")  # a round's training-call bytes, in each row
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
    # Asynchronous modes: where the passes over the data stood (engine.stream_state's
    # StreamPosition as a dict); None in sync mode.
    stream: dict[str, Any] | None = None


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint, description: dict[str, Any]) -> Path:
    """Write the checkpoint atomically (a kill mid-write leaves the previous one)."""
    arrays = {**checkpoint.weights,
              **{OPTIMIZER_PREFIX + k: v for k, v in checkpoint.optimizer.items()}}
    meta = {**description, "round": checkpoint.round, "policy_rng": checkpoint.policy_rng}
    if checkpoint.stream is not None:
        meta["stream"] = checkpoint.stream
    return save_model(run_dir / CHECKPOINT_FILE, arrays, meta)


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """The run's last checkpoint; CheckpointError names the file and what is wrong."""
    path = run_dir / CHECKPOINT_FILE
    try:
        arrays, meta = load_model(path)
    except ModelFileError as exc:
        raise CheckpointError(f"no usable checkpoint in {run_dir}: {exc}") from None
    optimizer = {k[len(OPTIMIZER_PREFIX):]: v for k, v in arrays.items()
                 if k.startswith(OPTIMIZER_PREFIX)}
    weights = without_optimizer(arrays)
    round_index = meta.get("round")
    if isinstance(round_index, bool) or not isinstance(round_index, int) or round_index < 0:
        raise CheckpointError(f"{path} is not a checkpoint: it has no round number "
                              "(a model file, or damaged)")
    try:
        rng = _rng_state(meta.get("policy_rng"))
    except (TypeError, ValueError):
        raise CheckpointError(f"{path} is damaged: its policy_rng is not a random "
                              "generator state") from None
    stream = meta.get("stream")
    if stream is not None and not isinstance(stream, dict):
        raise CheckpointError(f"{path} is damaged: its stream position is not an object")
    return Checkpoint(round_index, weights, optimizer, rng, stream)


def noise_key(run_dir: Path) -> bytes:
    """The secret key of a private run's noise and client draws, from its checkpoint (to
    replay the run elsewhere); CheckpointError when the run has none."""
    state = load_checkpoint(run_dir).optimizer
    if noise_keys.STATE_KEY not in state:
        raise CheckpointError(f"{run_dir / CHECKPOINT_FILE} holds no noise key: not a "
                              "private run's checkpoint")
    try:
        return noise_keys.from_state(state[noise_keys.STATE_KEY])
    except noise_keys.NoiseKeyError as exc:
        raise CheckpointError(f"{run_dir / CHECKPOINT_FILE} is damaged: {exc}") from None


def _rng_state(saved: Any) -> Any:
    """JSON turned getstate()'s tuples into lists; setstate wants them back."""
    if saved is None:
        return None
    version, internal, gauss = saved
    state = version, tuple(internal), gauss
    random.Random().setstate(state)  # raises on a damaged state, before the run starts
    return state


def check_weights(path: Path, weights: Weights, expected: Weights) -> None:
    """The checkpoint's weights must have the names and shapes of the run's model."""
    if set(weights) != set(expected):
        raise CheckpointError(f"{path} does not fit this run's model: it holds "
                              f"{sorted(weights)[:4]}, the model needs {sorted(expected)[:4]}")
    for name, array in expected.items():
        if weights[name].shape != array.shape or weights[name].dtype.kind not in "fiu":
            raise CheckpointError(
                f"{path} does not fit this run's model: {name} is {weights[name].dtype} "
                f"{weights[name].shape}, the model needs {array.dtype} {array.shape}")


def save_request(run_dir: Path, request: RunRequest) -> None:
    data = {name: getattr(request, name) for name in REQUEST_FIELDS}
    (run_dir / REQUEST_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_request(run_dir: Path) -> RunRequest:
    path = run_dir / REQUEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = {name: data[name] for name in REQUEST_FIELDS}
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: is {run_dir.name} a run of this "
                              "coordinator's --run-dir?") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc!r}") from None
    for name, value in fields.items():
        wanted = int if name == "rounds" else str
        optional = name == "outputs_json" and value is None
        if type(value) is not wanted and not optional:  # type(): a bool is no round count
            raise CheckpointError(f"{path} is damaged: {name} is not a {wanted.__name__}")
    return RunRequest(**fields)


def metrics_until(run_dir: Path, last_round: int) -> list[dict[str, Any]]:
    """The metrics rows of rounds up to `last_round`; later rows (rounds that will be
    done again) are dropped from the file, so each round appears once."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise CheckpointError(f"{path}, line {number} is damaged: not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("round", 0), int):
            raise CheckpointError(f"{path}, line {number} is damaged: not a round's metrics")
        rows.append(row)
    kept = [row for row in rows if row.get("round", 0) <= last_round]
    path.write_text("".join(metrics_line(row) for row in kept), encoding="utf-8")
    return kept


def metrics_of(row: dict[str, Any]) -> RoundMetrics:
    """A RoundMetrics back from a metrics.jsonl row."""
    core = ("round", "validation_error", "validation_loss", "train_loss", "seconds")
    not_scores = (*core, "discarded", *TRAFFIC_KEYS)
    scores = {k: float(v) for k, v in row.items()
              if k not in not_scores and isinstance(v, (int, float))}
    measured = {k: math.nan if row[k] is None else row[k] for k in core[1:]}  # null: NaN
    return RoundMetrics(round=row["round"], **measured, scores=scores or None)
