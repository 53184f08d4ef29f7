"""The Gaussian mechanism of DP-FedAvg (McMahan et al. 2018), at the coordinator.

Each client's update (its delta) is clipped to L2 norm ``clip`` over all its tensors
together; the round's clipped updates are summed, the sum gets Gaussian noise of standard
deviation ``noise_multiplier x clip`` on every coordinate, and the result is divided by the
expected number of clients per round: the unbiased estimator of the mean, whose sensitivity
to one client is ``clip / expected``. Clients are weighted uniformly: weighting by examples
would make one client's influence depend on its size and break that bound.

The noise is drawn from a generator seeded by (the run's noise key, round): the key is the
coordinator's secret (noise_key.py), so no one who knows the run's public seed can draw the
noise again and take it off, and a round computed again after a resume, the key restored
from the checkpoint, gets the same noise. In buffered mode a round is one release (one
buffer, divided by the buffer size), so the generator's index is the release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from thrift_trainer.training.privacy import noise_key
from thrift_trainer.training.units import Weights

NOISE_TAG = 0x44504E  # apart from every other stream keyed by (key, round)


def clipped(update: Mapping[str, np.ndarray], clip: float) -> dict[str, np.ndarray]:
    """``update`` scaled down, when its global L2 norm exceeds ``clip``, to norm ``clip``
    (float64, summed later)."""
    wide = {name: np.asarray(value, dtype=np.float64) for name, value in update.items()}
    norm = global_norm(wide)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {name: value * scale for name, value in wide.items()}


def global_norm(update: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of all of ``update``'s tensors as one vector."""
    return float(np.sqrt(sum(float(np.sum(np.square(value, dtype=np.float64)))
                             for value in update.values())))


def noise(like: Mapping[str, np.ndarray], std: float, key: bytes,
          round_index: int) -> dict[str, np.ndarray]:
    """Gaussian noise of standard deviation ``std`` shaped like ``like``, drawn by name
    order from a generator of (the noise ``key``, ``round_index``)."""
    generator = noise_key.generator(NOISE_TAG, key, round_index)
    return {name: generator.normal(0.0, std, size=np.shape(like[name])) if std > 0
            else np.zeros(np.shape(like[name])) for name in sorted(like)}


def private_mean(updates: Sequence[Mapping[str, np.ndarray]], like: Weights, clip: float,
                 noise_multiplier: float, expected_clients: float, key: bytes,
                 round_index: int) -> Weights:
    """The round's noised mean update: clipped updates summed, noise of standard deviation
    ``noise_multiplier x clip`` added, divided by ``expected_clients``; each tensor in the
    dtype of ``like``'s (the model's weights). No update (an empty Poisson round) still
    releases noise."""
    total = {name: np.zeros(np.shape(value), dtype=np.float64) for name, value in like.items()}
    for update in updates:
        for name, value in clipped(update, clip).items():
            total[name] += value
    drawn = noise(like, noise_multiplier * clip, key, round_index)
    return {name: ((total[name] + drawn[name]) / expected_clients).astype(
        np.asarray(like[name]).dtype) for name in like}
