"""An optimizer's step a block of elements at a time, in place on the parameters.

torch's Adam on the CPU steps each parameter whole, and its step makes temporaries the
size of the parameter (the square root of the second moment, then its quotient): for a
layer of a gigabyte, two more gigabytes for a moment. `step_in_blocks` runs torch's own
Adam (or AdamW) on views of a block of each parameter, its gradient and its moments in
turn: every element goes through the same operations, so the bits are those of
``optimizer.step()``, and the temporaries are a block's. The gradient may even be made a
block at a time as the step takes it (``gradients``: the coordinator's average of a
round's results), so that no whole gradient is ever held. Other optimizers, and Adam in a
mode this does not cover (AMSGrad, fused, foreach, capturable, differentiable, complex or
non-CPU parameters), take their own ``step()`` on whole gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch.optim.adam import adam

BLOCK_ELEMENTS = 1 << 20  # 4 MiB of float32 per temporary
# elements [start, stop) of a parameter's gradient, flat, of the parameter's dtype
GradientBlock = Callable[[slice], torch.Tensor]


def step_in_blocks(optimizer: torch.optim.Optimizer,
                   gradients: Mapping[torch.Tensor, GradientBlock] | None = None,
                   block_elements: int = BLOCK_ELEMENTS) -> None:
    """``optimizer.step()``, a block of ``block_elements`` at a time where it can be.
    ``gradients``: each parameter's gradient as a function of a block (the parameters'
    ``.grad`` is then neither read nor left set); None: their ``.grad``."""
    if gradients is None:
        gradients = {p: _grad_blocks(p) for group in optimizer.param_groups
                     for p in group["params"] if p.grad is not None}
    if not _blockwise(optimizer, gradients):
        _whole_step(optimizer, gradients)
        return
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param in gradients:
                    _step_param(optimizer, group, param, gradients[param], block_elements)


def _grad_blocks(param: torch.Tensor) -> GradientBlock:
    flat = param.grad.view(-1)
    return lambda block: flat[block]


def _whole_step(optimizer: torch.optim.Optimizer,
                gradients: Mapping[torch.Tensor, GradientBlock]) -> None:
    """The optimizer's own step, on whole gradients made of the blocks when needed."""
    made = [p for p in gradients if p.grad is None]
    for param in made:
        param.grad = gradients[param](slice(0, param.numel())).view_as(param)
    optimizer.step()
    for param in made:
        param.grad = None


def _blockwise(optimizer: torch.optim.Optimizer,
               gradients: Mapping[torch.Tensor, GradientBlock]) -> bool:
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return False
    for group in optimizer.param_groups:
        if any(group.get(key) for key in ("amsgrad", "fused", "foreach", "capturable",
                                          "differentiable")):
            return False
        for param in group["params"]:
            grad = param.grad
            if param in gradients and (
                    param.device.type != "cpu" or torch.is_complex(param)
                    or not param.is_contiguous()
                    or (grad is not None and (grad.is_sparse or not grad.is_contiguous()))):
                return False
    return True


def _step_param(optimizer: torch.optim.Optimizer, group: dict, param: torch.Tensor,
                gradient: GradientBlock, block_elements: int) -> None:
    state = optimizer.state[param]
    if not state:  # as Adam starts a parameter's state (on the CPU, not fused)
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        state["step"] = torch.tensor(0.0, dtype=scalar)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    flat = [t.view(-1) for t in (param, state["exp_avg"], state["exp_avg_sq"])]
    beta1, beta2 = group["betas"]
    for start in range(0, param.numel(), block_elements):
        block = slice(start, start + block_elements)
        p, m, v = (t[block] for t in flat)
        # each block counts this step from the same step number; the state's below
        adam([p], [gradient(block)], [m], [v], [], [state["step"].clone()], foreach=False,
             decoupled_weight_decay=group.get("decoupled_weight_decay", False),
             amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
             weight_decay=group["weight_decay"], eps=group["eps"],
             maximize=group["maximize"])
    state["step"] += 1
