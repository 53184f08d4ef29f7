"""The letters MLP under sync_sgd: a node's mean gradient over its unit (the MLP's own
numpy backpropagation, in float64), and the coordinator's parameters with their Adam.

Names on the wire: weights ``W``, ``W2``, ..., ``V``; a node's update ``grad.<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrift_trainer.training.algorithms.letters_files import validation_data
from thrift_trainer.training.models import mlp
from thrift_trainer.training.models.modules import float32_copy
from thrift_trainer.training.models.names import GRAD
from thrift_trainer.training.units import RoundEval, UnitJob, UnitOutput, Weights
from thrift_trainer.training.update_checks import check_combined_names


def mlp_spec(config: Mapping[str, Any]) -> mlp.MLPSpec:
    return mlp.MLPSpec(hidden=tuple(config["hidden"]), scale_features=config["scale_features"])


def run_mlp_unit(job: UnitJob, config: Mapping[str, Any], features: np.ndarray,
                 labels: np.ndarray) -> UnitOutput:
    """The unit's mean gradient as float32 ``grad.<name>`` arrays, and the error and loss
    of the weights it was sent on the unit's rows."""
    spec = mlp_spec(config)
    mlp.check_params(job.weights, spec)
    gradients = mlp.mean_gradients(job.weights, features, labels, spec, config["batch_size"],
                                   job.control.step)
    update = {GRAD + name: value.astype(np.float32) for name, value in gradients.items()}
    error, loss = mlp.evaluate(job.weights, features, labels, spec)
    return UnitOutput(update=update, num_samples=len(labels), loss=loss, error=error)


class MlpState:
    """The MLP's parameters as float32 torch leaves and their Adam optimizer."""

    def __init__(self, config: Mapping[str, Any], dataset_dir: Path,
                 betas: tuple[float, float]) -> None:
        self.spec = mlp_spec(config)
        initial = mlp.init_params(self.spec, seed=config["seed"])
        self.params = {name: torch.tensor(value, dtype=torch.float32, requires_grad=True)
                       for name, value in initial.items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=config["lr"],
                                          betas=betas)
        self.validation = validation_data(dataset_dir)

    def weights(self) -> Weights:
        return {name: float32_copy(p) for name, p in self.params.items()}

    def step(self, weights: Weights, average: Weights) -> Weights:
        check_combined_names(average, [GRAD + name for name in self.params])
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(torch.from_numpy(np.asarray(weights[name], dtype=np.float32)))
                param.grad = torch.from_numpy(np.asarray(average[GRAD + name], np.float32))
        self.optimizer.step()
        return self.weights()

    def evaluate(self, weights: Weights) -> RoundEval:
        error, loss = mlp.evaluate(weights, *self.validation, self.spec)
        return RoundEval(validation_error=float(error), validation_loss=float(loss))

    def description(self) -> dict[str, Any]:
        return {"model": "mlp", "spec": self.spec.to_dict()}

    def optimizers(self) -> dict[str, tuple[dict[str, torch.Tensor], torch.optim.Optimizer]]:
        return {"mlp": (self.params, self.optimizer)}

    def parameter_names(self) -> list[str]:
        return list(self.params)
