"""What a run writes in its folder (`<run root>/<run id>/`), in one place.

A run with federated clients also keeps ``partition.json`` and ``partition.png`` and, per
round, its clients' lines of ``clients.jsonl`` (coordinator/client_files.py).

At the start ``run.json`` (the run as it was set up) and ``request.json`` (what a resume
needs); after every round a row of ``metrics.jsonl``, the sample grid when one is due and,
last, ``checkpoint.npz``, the commit point a resume starts from (so the metrics and the
ledger already hold every round it covers); at the end ``model.npz``, ``model.safetensors``
(for plain torch: training/outputs/torch_files.py) and ``curves.png``.

Trackers (coordinator/tracking.py: TensorBoard, MLflow) get the same: the run's description
at the start, each round's row, and the final files at the end.

With a run store that keeps files (PostgreSQL's), request.json, metrics.jsonl and the
checkpoint are also written there as they change (``keep``), so a coordinator on another
machine can carry the run on from the database alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from thrift_trainer.coordinator import client_files
from thrift_trainer.coordinator.checkpoint import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    REQUEST_FILE,
    Checkpoint,
    metrics_until,
    save_checkpoint,
    save_request,
)
from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.coordinator.tracking import Trackers
from thrift_trainer.engine.phase_clock import PHASES_KEY
from thrift_trainer.engine.records import RoundMetrics
from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.outputs.model_file import save_model
from thrift_trainer.training.outputs.plots import due, metrics_line, save_curves, save_grid
from thrift_trainer.training.outputs.torch_files import SAFETENSORS_FILE, save_safetensors
from thrift_trainer.training.units import Weights

SAMPLE_COUNT, SAMPLE_SEED = 64, 2024  # every sample grid of a run shows the same noise
MODEL_FILE = "model.npz"


class RunFolder:
    """The files of one run; `rows` are its metrics so far, for the curves."""

    def __init__(self, run_dir: Path, algorithm: Algorithm, outputs: dict[str, int],
                 rounds: int, keep: Callable[[str, Path, int | None], None] | None = None,
                 trackers: Trackers | None = None) -> None:
        """``keep(name, path, round)``: copy a file the resume needs into the run store
        (``round``: the checkpoint's, for a drill's point of death)."""
        self.path = run_dir
        self.algorithm = algorithm
        self.outputs = outputs
        self.rounds = rounds
        self.rows: list[dict[str, Any]] = []
        self._keep = keep
        self.trackers = trackers or Trackers(())

    def _kept(self, name: str, round_index: int | None = None) -> None:
        if self._keep is not None:
            self._keep(name, self.path / name, round_index)

    def start(self, description: dict[str, Any], request: RunRequest) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "run.json").write_text(json.dumps(description, indent=2) + "\n",
                                            encoding="utf-8")
        save_request(self.path, request)
        self._kept(REQUEST_FILE)
        if self.algorithm.partition is not None:
            self.keep_partition(self.algorithm.partition)
        self.trackers.start(str(description.get("run_id", self.path.name)), description)

    def keep_partition(self, record: PartitionRecord) -> None:
        """partition.json: the run's clients, their sizes and label counts."""
        client_files.write_partition(self.path, record)

    def restore(self, last_round: int) -> None:
        """The rows of rounds up to ``last_round`` (a resume's checkpoint): later rows, of
        rounds the checkpoint does not cover, are dropped from metrics.jsonl."""
        self.rows = [{k: v for k, v in row.items() if k not in ("discarded", PHASES_KEY)}
                     for row in metrics_until(self.path, last_round)]
        client_files.keep_until(self.path, last_round)

    def append_clients(self, rows: list[dict[str, Any]]) -> None:
        """A round's lines of clients.jsonl (coordinator/client_files.py)."""
        client_files.append_clients(self.path, rows)

    def append_round(self, metrics: RoundMetrics, discarded: list[str],
                     traffic: dict[str, int], phases: dict[str, float]) -> None:
        """One row of metrics.jsonl; `traffic`: the round's training-call bytes; `phases`:
        seconds per phase of the round (engine/phase_clock.py)."""
        row = {"round": metrics.round, "validation_error": metrics.validation_error,
               "validation_loss": metrics.validation_loss, "train_loss": metrics.train_loss,
               "seconds": metrics.seconds, **(metrics.scores or {}), **traffic,
               "discarded": discarded, PHASES_KEY: phases}
        self.rows.append({k: v for k, v in row.items() if k not in ("discarded", PHASES_KEY)})
        with open(self.path / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(metrics_line(row))
        self._kept(METRICS_FILE)
        self.trackers.log_round(metrics.round, row)

    def write_samples(self, round_index: int, weights: Weights) -> None:
        """This round's sample grid, when it is due (and the algorithm makes images)."""
        if due(self.outputs["sample_every"], round_index, self.rounds):
            images = self.algorithm.sample_images(weights, SAMPLE_COUNT, seed=SAMPLE_SEED)
            if images is not None:
                save_grid(images, self.path / "samples" / f"round_{round_index:05d}.png")

    def checkpoint_due(self, round_index: int) -> bool:
        """Whether round ``round_index`` ends with a checkpoint."""
        return due(self.outputs["checkpoint_every"], round_index, self.rounds)

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The round's checkpoint, when it is due."""
        if self.checkpoint_due(checkpoint.round):
            save_checkpoint(self.path, checkpoint, self.algorithm.model_description())
            self._kept(CHECKPOINT_FILE, checkpoint.round)

    def finish(self, weights: Weights, config: dict[str, Any]) -> Path:
        """The final model, in this project's .npz and as safetensors, and the curves."""
        description = self.algorithm.model_description()
        model_path = save_model(self.path / MODEL_FILE, weights, description)
        save_safetensors(self.path / SAFETENSORS_FILE, weights, {
            "model": self.algorithm.model, "description": description, "config": config,
            "plugins": plugins.versions()})
        save_curves(self.rows, self.path / "curves.png", self.curves_title())
        if self.algorithm.partition is not None:
            client_files.draw_partition(self.algorithm.partition,
                                        self.path / client_files.PARTITION_PICTURE)
        self.trackers.finish("completed", [
            self.path / name for name in (SAFETENSORS_FILE, "curves.png", METRICS_FILE,
                                          client_files.PARTITION_PICTURE)])
        return model_path

    def curves_title(self) -> str:
        """The run, its algorithm, model and data set: what a reader of the figure alone
        needs to know which run it shows."""
        algorithm = self.algorithm  # a plug-in's may lack what the built-in ones set
        name = getattr(algorithm, "name", type(algorithm).__name__)
        return (f"run {self.path.name}: {name}, model {getattr(algorithm, 'model', '?')}, "
                f"data {getattr(algorithm, 'dataset', '?')}")

    def end_tracking(self, state: str) -> None:
        """The run ended `state` (failed, cancelled): its trackers end so too (once)."""
        self.trackers.finish(state)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_FILE
