"""The result of a run trained from Python (api.py): its figures, its weights, the model
file the client saved, and the trained model rebuilt as a torch module."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class TrainingResult:
    """A completed run.

    ``history``: one dict per round (round, validation_error, validation_loss, train_loss,
    seconds, ...); ``weights``: the final model's arrays by name; ``description``: how to
    rebuild the model (the model file's description); ``model_path``: the model file
    saved on this machine (``export_path``: the same as safetensors); ``run_dir``: the
    run's folder on the coordinator's machine; ``summary``: everything ``client.py
    --json`` prints.
    """

    run_id: str
    validation_error: float
    rounds: int
    wall_seconds: float
    history: list[dict[str, Any]]
    weights: dict[str, np.ndarray]
    description: dict[str, Any]
    model_path: Path
    export_path: Path | None
    run_dir: str
    summary: dict[str, Any]
    plugins: list[str] = field(default_factory=list)
    plugin_dir: str | os.PathLike | None = None

    @classmethod
    def from_run(cls, kept: dict[str, Any], result: Any, plugins: Sequence[str] = (),
                 plugin_dir: str | os.PathLike | None = None) -> TrainingResult:
        """From the client's saved result (``kept``, as --json prints it) and the
        coordinator's RunResult."""
        from thrift_trainer.training.outputs.model_file import without_optimizer
        from thrift_trainer.wire.tensor_codec import wire_to_dict

        return cls(run_id=kept["run_id"], validation_error=kept["validation_error"],
                   rounds=kept["rounds"], wall_seconds=kept["wall_seconds"],
                   history=kept["history"],
                   weights=without_optimizer(wire_to_dict(result.weights)),
                   description=json.loads(result.model_json), model_path=Path(
                       kept["model_path"]),
                   export_path=Path(kept["export"]) if kept.get("export") else None,
                   run_dir=kept["coordinator_run_dir"], summary=kept,
                   plugins=list(plugins), plugin_dir=plugin_dir)

    @property
    def model_name(self) -> str:
        return str(self.description.get("model", ""))

    def module(self) -> Any:
        """The trained model as a torch ``nn.Module`` in eval mode (``mlp_classifier`` or
        a plug-in model, built with its plug-in). The letters MLP is a numpy model and a
        GAN two networks: those are refused with a ValueError; `predict` and `evaluate`
        score the letters MLP."""
        if self.model_name == "mlp":
            raise ValueError(f"run {self.run_id} trained the letters MLP, a numpy model, not "
                             "a torch module: use result.predict(path), result.evaluate() or "
                             "its arrays, result.weights")
        if "gan" in self.description:
            raise ValueError(f"run {self.run_id} trained a GAN ({self.model_name}): its "
                             f"generator is in {self.model_path}; module() rebuilds "
                             "classifiers and regressors")
        from thrift_trainer.client import torch_scoring

        self._allow_plugins()
        return torch_scoring.build_module(str(self.model_path), self.weights,
                                          self.description)

    def evaluate(self, data: str | os.PathLike | None = None) -> dict[str, Any]:
        """The run's metric ("error") and loss on labelled data, as ``client.py evaluate``
        scores the model file (default data: the letters validation file, for models
        trained on letters)."""
        from thrift_trainer.client import model_commands

        self._allow_plugins()
        return model_commands.evaluate(str(self.model_path),
                                       None if data is None else str(data))

    def predict(self, data: str | os.PathLike) -> list[str]:
        """One prediction per example of ``data``, as ``client.py predict`` gives them."""
        from thrift_trainer.client import model_commands

        self._allow_plugins()
        return model_commands.predict(str(self.model_path), str(data))

    def _allow_plugins(self) -> None:
        if self.plugins:
            from thrift_trainer.training import plugins

            plugins.allow(self.plugins, self.plugin_dir)
