"""Fault injection for tests and drills: updates a broken or hostile node might send."""

from __future__ import annotations

import numpy as np

from training.algorithms.base import Weights

CORRUPTIONS = ("nan", "shape", "huge")


def corrupt_update(update: Weights, mode: str) -> Weights:
    """`update` spoiled the way `mode` says: NaN values, a tensor one row short, or
    finite values of the right shape a million times too large."""
    if mode == "nan":
        return {name: np.full_like(value, np.nan) for name, value in update.items()}
    if mode == "shape":
        return {name: value[:-1] if value.ndim and len(value) > 1 else value
                for name, value in update.items()}
    if mode == "huge":
        return {name: value * 1e6 for name, value in update.items()}
    raise ValueError(f"unknown corruption {mode!r}; one of {', '.join(CORRUPTIONS)}")
