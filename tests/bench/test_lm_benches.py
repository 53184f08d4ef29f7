"""The language-model benches' baselines (devtools/torch_baselines.py, devtools/gpt_example.py)
train what the trainer trains: the coordinator's first weights, the mean gradient over
micro-batches, sync_sgd's order of windows, and the validation loss as the coordinator
scores it (no process is started)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from devtools import gpt_example, torch_baselines
from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import torch_model
from thrift_trainer.training.models import modules
from thrift_trainer.training.models.module_training import evaluate

TINY = {"block_size": 16, "d_model": 16, "n_layer": 1, "n_head": 2}


@pytest.fixture
def example_plugins() -> Iterator[None]:
    plugins.allow(["gpt_model", "stdlib_corpus"], gpt_example.EXAMPLE)
    try:
        yield
    finally:
        plugins.reset()


def test_the_baselines_start_from_the_coordinators_weights(example_plugins) -> None:
    ours = modules.build("gpt_model:GPT", TINY, seed=gpt_example.SEED)
    theirs = gpt_example.build_model(TINY)
    for (name, a), (other, b) in zip(ours.state_dict().items(),
                                     theirs.state_dict().items(), strict=True):
        assert name == other and torch.equal(a, b)


def test_micro_batches_give_the_mean_gradient_of_the_whole_batch() -> None:
    torch.manual_seed(0)
    inputs, targets = torch.randn(10, 4), torch.randint(0, 3, (10,))
    whole, parts = nn.Linear(4, 3), nn.Linear(4, 3)
    parts.load_state_dict(whole.state_dict())

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    loss(whole, inputs, targets).backward()
    torch_baselines.accumulate(parts, loss, inputs, targets, 4)  # 4 + 4 + 2
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def _numbers(size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.tensor([float(i)]), torch.tensor(i)) for i in range(size)]


def test_a_single_process_step_takes_a_sync_sgd_rounds_units() -> None:
    """Units of 3 of 10 examples, 2 a step: the fourth unit of a pass is short, and the
    next pass starts again at 0, as sync_sgd's units walk the training part."""
    seen: list[list[int]] = []

    def record(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen[-1].extend(targets.tolist())
        return model(inputs).sum() * 0

    work = torch_baselines.Workload(
        model=functools.partial(nn.Linear, 1, 1),
        optimizer=lambda module: torch.optim.SGD(module.parameters(), lr=0.1),
        data=functools.partial(_numbers, 10), loss=record, unit=3, batch=3)
    loop = torch_baselines.SingleProcess(work, workers=2)
    for _ in range(3):
        seen.append([])
        loop.step()
    assert seen == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9], [0, 1, 2, 3, 4, 5]]


def test_the_baselines_score_the_validation_part_as_the_coordinator_does(
        example_plugins, tmp_path) -> None:
    root = gpt_example.data_root(tmp_path)
    config = {"model": {"args": TINY}, "data": {"args": {"block_size": TINY["block_size"]}}}
    setup = torch_model.setup_of("gpt_model:GPT", config, "stdlib_corpus:stdlib_text", root)
    module = setup.build(seed=3)
    validation = gpt_example.stdlib_corpus.stdlib_text(root, "validation", TINY["block_size"])
    ours = torch_baselines.evaluate(module, gpt_example.next_byte_loss, validation)
    assert ours == pytest.approx(evaluate(setup, module)[1], rel=1e-6)
    assert np.isfinite(ours)
