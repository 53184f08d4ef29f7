"""Checks of a node's update and of what the round combined from them: the tensors it
must hold (names, shapes, dtypes), finite values, and a possible sample count. The
round's update filters (engine/update_filters.py) and a relay's checks of its members
(compute_node/relay.py) run them; `Algorithm.check_update` is built on them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from thrift_trainer.training.units import TensorSpecs

FINITE_BLOCK = 1 << 20  # elements tested at a time


def specs_of(weights: Mapping[str, np.ndarray], prefix: str = "") -> dict[str, tuple]:
    """Each tensor's (shape, dtype), under `prefix` + its name."""
    return {prefix + name: (value.shape, value.dtype) for name, value in weights.items()}


def check_tensors(update: Mapping[str, np.ndarray], expected: TensorSpecs) -> None:
    """ValueError naming the first tensor missing, unexpected, or of another shape or dtype."""
    if set(update) != set(expected):
        missing = sorted(set(expected) - set(update))[:3]
        unexpected = sorted(set(update) - set(expected))[:3]
        raise ValueError(f"update tensors do not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
    for name, (shape, dtype) in expected.items():
        value = update[name]
        if value.shape != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {value.shape}, expected {tuple(shape)}")
        if value.dtype != dtype:
            raise ValueError(f"tensor {name!r} has dtype {value.dtype}, expected {dtype}")


def check_update_form(update: Mapping[str, np.ndarray], expected: TensorSpecs | None) -> None:
    """ValueError unless ``update`` has the ``expected`` tensors (when known: names, shapes,
    dtypes) and only finite values: `Algorithm.check_update`'s default, and what a relay
    checks of its members' results (it gets ``expected`` with each unit)."""
    if expected is not None:
        check_tensors(update, expected)
    for name, value in update.items():
        if not all_finite(value):
            raise ValueError(f"tensor {name!r} holds NaN or infinite values")


def all_finite(value: np.ndarray) -> bool:
    """Whether every value is finite, looked at a block at a time: a whole-array test
    makes a mask of a byte per element (256 MiB for a layer of a gigabyte)."""
    flat = np.asarray(value).reshape(-1)
    if not np.issubdtype(flat.dtype, np.inexact):
        return True  # integers and booleans are
    return all(np.isfinite(flat[start:start + FINITE_BLOCK]).all()
               for start in range(0, flat.size, FINITE_BLOCK))


def check_sample_count(num_samples: int, holds: int | None) -> None:
    """ValueError unless a result's sample count is possible: at least 1 and at most what
    its unit holds (when known). The count weighs the result in the average, so a node
    claiming more than its unit could otherwise outweigh every other node."""
    upper = "" if holds is None else f"..{holds}"
    if num_samples < 1 or (holds is not None and num_samples > holds):
        raise ValueError(f"num_samples {num_samples} is out of range 1{upper} "
                         f"(the samples its unit holds)")


def check_combined_names(average: Mapping[str, np.ndarray], expected: Sequence[str]) -> None:
    """A partial or foreign combined update is a bug somewhere; refuse it before any
    optimizer step."""
    if sorted(average) != sorted(expected):
        missing = sorted(set(expected) - set(average))[:3]
        unexpected = sorted(set(average) - set(expected))[:3]
        raise ValueError(f"averaged update does not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
