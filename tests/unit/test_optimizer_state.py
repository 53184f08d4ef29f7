"""An optimizer's state survives its trip through named arrays (checkpoints, moved sessions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thrift_trainer.training.optimizer_state import (
    ADAM_KEYS,
    load_optimizer_arrays,
    optimizer_arrays,
)


def _stepped(seed: int) -> tuple[torch.nn.Linear, torch.optim.Adam]:
    torch.manual_seed(seed)
    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    module(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    return module, optimizer


def test_adam_state_comes_back_exactly() -> None:
    module, optimizer = _stepped(0)
    arrays = optimizer_arrays(dict(module.named_parameters()), optimizer, "optim.x.")
    assert sorted(arrays) == sorted(f"optim.x.{name}.{key}" for name in ("weight", "bias")
                                    for key in ADAM_KEYS)
    other, fresh = _stepped(1)
    load_optimizer_arrays(dict(other.named_parameters()), fresh, arrays, "optim.x.", ADAM_KEYS)
    again = optimizer_arrays(dict(other.named_parameters()), fresh, "optim.x.")
    assert all(np.array_equal(arrays[key], again[key]) for key in arrays)
    assert fresh.state[other.weight]["step"].device.type == "cpu"


def test_a_partial_adam_state_is_refused() -> None:
    module, optimizer = _stepped(0)
    arrays = optimizer_arrays(dict(module.named_parameters()), optimizer)
    del arrays["weight.exp_avg"]
    with pytest.raises(ValueError, match="Adam state of weight"):
        load_optimizer_arrays(dict(module.named_parameters()), optimizer, arrays, keys=ADAM_KEYS)
