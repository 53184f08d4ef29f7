"""A torch optimizer's per-parameter state as named float32 arrays, and back.

What a checkpoint (sync_sgd's coordinator optimizers, MD-GAN's generator) and a moved
MD-GAN discriminator session carry of an optimizer: for every parameter, each entry of
its state (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``) under ``<prefix><param>.<key>``.
Restoring them lets a resumed run or a moved discriminator continue exactly where it
was, instead of taking its first steps with fresh moments at a full learning rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from thrift_trainer.training.models.modules import float32_copy

ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")


def optimizer_arrays(named: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                     prefix: str = "", copy: bool = True) -> dict[str, np.ndarray]:
    """The state of each of the ``named`` parameters, keyed ``<prefix><param>.<key>``:
    float32 copies, or with ``copy`` off views of the float32 CPU tensors (for a reader
    done with them before the next step, as a checkpoint written at once)."""
    convert = float32_copy if copy else float32_view
    return {f"{prefix}{name}.{key}": convert(value)
            for name, param in named.items()
            for key, value in optimizer.state.get(param, {}).items()}


def load_optimizer_arrays(named: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                          arrays: Mapping[str, np.ndarray], prefix: str = "",
                          keys: Sequence[str] | None = None) -> None:
    """Put back what `optimizer_arrays` made: each parameter's entries under ``prefix``
    (a parameter with none keeps its state). ``keys``: the entries a parameter's state
    must have, ValueError otherwise. A ``step`` stays on the CPU, where Adam keeps it;
    the other entries go to their parameter's device."""
    for name, param in named.items():
        found = {key[len(prefix) + len(name) + 1:]: value for key, value in arrays.items()
                 if key.startswith(f"{prefix}{name}.")}
        if not found:
            continue
        if keys is not None and sorted(found) != sorted(keys):
            raise ValueError(f"Adam state of {name} holds {sorted(found)}")
        optimizer.state[param] = {key: _tensor(key, value, param.device)
                                  for key, value in found.items()}


def float32_view(tensor: torch.Tensor) -> np.ndarray:
    """The tensor as a float32 array: a view when it is one on the CPU, else a copy."""
    if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and \
            tensor.is_contiguous() and not tensor.requires_grad:
        return tensor.numpy()
    return float32_copy(tensor)


def _tensor(key: str, value: np.ndarray, device: torch.device) -> torch.Tensor:
    if key == "step":
        return torch.from_numpy(np.array(value, dtype=np.float32).reshape(()))
    return torch.from_numpy(np.array(value, copy=True)).to(device)

