"""Fault injection for tests and drills: results a broken or hostile node might send."""

from __future__ import annotations

import dataclasses

import numpy as np

from training.algorithms.base import UnitOutput, Weights

UPDATE_CORRUPTIONS = ("nan", "shape", "huge")
# Sample counts weigh a result in the average: none at all, or enough to outweigh any node.
SAMPLE_CORRUPTIONS = {"zero-samples": 0, "huge-samples": 10**15}
CORRUPTIONS = (*UPDATE_CORRUPTIONS, *SAMPLE_CORRUPTIONS)


def corrupt_output(output: UnitOutput, mode: str) -> UnitOutput:
    """`output` with its update or its sample count spoiled the way `mode` says."""
    if mode in SAMPLE_CORRUPTIONS:
        return dataclasses.replace(output, num_samples=SAMPLE_CORRUPTIONS[mode])
    return dataclasses.replace(output, update=corrupt_update(output.update, mode))


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
