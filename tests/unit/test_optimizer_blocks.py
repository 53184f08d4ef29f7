"""An optimizer's step a block at a time: the bits of torch's own step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from thrift_trainer.training.optimizer_blocks import step_in_blocks

OPTIMIZERS = [
    (torch.optim.Adam, {}),
    (torch.optim.Adam, {"weight_decay": 0.1, "maximize": True}),
    (torch.optim.AdamW, {"weight_decay": 0.01}),
    (torch.optim.Adam, {"amsgrad": True}),  # not covered: torch's own step
    (torch.optim.SGD, {"momentum": 0.9}),  # likewise
]


def _twins(kind, options) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module,
                                     torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(37, 53), nn.ReLU(), nn.Linear(53, 5))
    twin = copy.deepcopy(model)
    return (model, kind(model.parameters(), lr=1e-2, **options),
            twin, kind(twin.parameters(), lr=1e-2, **options))


def _backward(model: nn.Module, inputs: torch.Tensor) -> None:
    for param in model.parameters():
        param.grad = None
    model(inputs).square().sum().backward()


@pytest.mark.parametrize(("kind", "options"), OPTIMIZERS)
def test_steps_in_blocks_are_torchs_own_steps_bit_for_bit(kind, options):
    model, optimizer, twin, twin_optimizer = _twins(kind, options)
    for _ in range(3):
        inputs = torch.randn(8, 37)
        _backward(model, inputs)
        _backward(twin, inputs)
        optimizer.step()
        step_in_blocks(twin_optimizer, block_elements=100)  # blocks that cut rows
    for param, other in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(param, other)
        for key, value in optimizer.state[param].items():
            assert torch.equal(value, twin_optimizer.state[other][key]), key


@pytest.mark.parametrize(("kind", "options"), OPTIMIZERS)
def test_a_gradient_made_block_by_block_steps_as_the_whole_gradient(kind, options):
    model, optimizer, twin, twin_optimizer = _twins(kind, options)
    _backward(model, torch.randn(8, 37))
    grads = {other: param.grad.clone().view(-1)
             for param, other in zip(model.parameters(), twin.parameters(), strict=True)}
    asked: list[slice] = []

    def blocks(flat: torch.Tensor):
        def block(elements: slice) -> torch.Tensor:
            asked.append(elements)
            return flat[elements].clone()
        return block

    optimizer.step()
    step_in_blocks(twin_optimizer, {p: blocks(g) for p, g in grads.items()},
                   block_elements=64)
    for param, other in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(param, other)
        assert other.grad is None  # nothing of the gradient stays with the module
    blockwise = kind is not torch.optim.SGD and not options.get("amsgrad")
    assert max(s.stop - s.start for s in asked) == (64 if blockwise else 37 * 53)
