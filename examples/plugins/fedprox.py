"""FedProx: federated averaging whose local steps stay near the round's weights.

Each node adds the proximal term mu/2 * ||w - w_round||^2 over the model's parameters to
every local step's loss (Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020), which keeps nodes with unlike data from drifting apart during their local
epochs. Everything else is delta averaging's (``delta_avg``): the local optimizer, the
units, the server optimizer, the aggregation rule. It trains torch models (the built-in
``mlp_classifier`` or a plug-in model), not the numpy letters MLP.

Use it: start the coordinator and every node with ``--plugins fedprox`` (from this folder,
or with ``--plugin-dir examples/plugins``) and name it in the run's config::

    run:
      algorithm: fedprox:FedProx
      algorithm_args: {mu: 0.01, units: 10, local_optimizer: sgd, eta: 0.05}

``run.algorithm_args`` holds delta_avg's keys and ``mu`` (default 0.01; 0 is plain
federated averaging).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

import thrift_trainer as tt

DEFAULT_MU = 0.01


class FedProx(tt.algorithms.DeltaAveraging):
    """Delta averaging with FedProx's proximal term in the nodes' local steps."""

    name = "fedprox"

    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """``mu`` checked here; every other key by delta averaging."""
        rest = dict(config)
        mu = rest.pop("mu", DEFAULT_MU)
        if isinstance(mu, bool) or not isinstance(mu, int | float) \
                or not (math.isfinite(mu) and mu >= 0):
            raise tt.ConfigError(f"config key 'mu' must be a number >= 0, got {mu!r}")
        return {**super().check_config(model, rest), "mu": float(mu)}

    @classmethod
    def local_penalty(cls, job: tt.UnitJob) -> Callable[..., torch.Tensor] | None:
        """mu/2 * ||w - w_round||^2, summed over the parameters (buffers are states, not
        trained, so they have no term)."""
        mu = cls.unit_config(job)["mu"]
        if mu == 0:
            return None
        anchors: dict[str, torch.Tensor] = {}  # the round's weights as tensors, made once

        def proximal(module: nn.Module, weights: Mapping[str, Any]) -> torch.Tensor:
            squares = []
            for name, param in module.named_parameters():
                if name not in anchors:  # a copy: the received arrays are read-only,
                    # which torch.as_tensor warns about (it would share their memory)
                    anchors[name] = torch.tensor(weights[name], dtype=param.dtype,
                                                 device=param.device)
                squares.append((param - anchors[name]).pow(2).sum())
            return 0.5 * mu * torch.stack(squares).sum()

        return proximal
