"""The pieces of a torch training step that a run's settings shape (run.lr_schedule,
clip_norm, precision; training/models/settings.py): the rate of a step, gradient clipping
and mixed precision. training/models/module_training.py calls them; with the defaults each
is a no-op, so a run that sets none of them computes exactly what it computed before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.lr_schedule import Schedule

# sync_sgd's mean gradients in fp16 are scaled by this constant (a unit is one backward
# pass per micro-batch, too short for a dynamic scaler to settle) and unscaled in fp32
FP16_GRADIENT_SCALE = 2.0**10


def set_rate(optimizer: torch.optim.Optimizer, base: float, schedule: Schedule,
             step: int) -> None:
    """The optimizer's rate at ``step`` of ``schedule``; untouched by a constant one."""
    if schedule.is_constant:
        return
    for group in optimizer.param_groups:
        group["lr"] = base * schedule.factor(step)


def clip(params: Sequence[torch.Tensor], max_norm: float) -> None:
    """Gradients (``.grad``) scaled down to a global norm of ``max_norm``; 0: off."""
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)


def clip_tensors(grads: Sequence[torch.Tensor], max_norm: float) -> None:
    """Gradient tensors (not ``.grad`` fields) scaled in place to a global norm of
    ``max_norm``, as `clip` does; 0: off."""
    if max_norm <= 0 or not grads:
        return
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = max_norm / (float(norm) + 1e-6)
    if scale < 1.0:
        for grad in grads:
            grad.mul_(scale)


def check_precision(precision: str, device: str) -> None:
    """fp16 needs CUDA (its loss scaler and fast kernels); bf16 and fp32 run anywhere."""
    if precision == "fp16" and not device.startswith("cuda"):
        raise ConfigError(f"run.precision fp16 needs a CUDA device; this node computes on "
                          f"{device} (bf16 runs on the CPU)")


@contextlib.contextmanager
def autocast(precision: str, device: str) -> Iterator[None]:
    """The forward pass and the loss in ``precision`` (autocast); fp32: as they are."""
    if precision == "fp32":
        yield
        return
    check_precision(precision, device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    with torch.autocast(device_type=device.split(":")[0], dtype=dtype):
        yield


def scaler(precision: str, device: str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 (CUDA), None otherwise."""
    if precision != "fp16":
        return None
    check_precision(precision, device)
    return torch.amp.GradScaler(device.split(":")[0])
