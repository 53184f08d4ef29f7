"""The geometric median of a round's updates: a robust aggregation rule.

The geometric median is the point whose summed distance to the updates is smallest (each
update seen as one vector of all its tensors). Unlike the mean, a minority of updates,
however far off, cannot drag it far: it resists up to half of the updates being Byzantine
(Pillutla et al., "Robust Aggregation for Federated Learning", 2022). It is found by
Weiszfeld's iterations from the mean: each one re-weights the updates by their sample
counts over their distance to the current estimate. A bounded number of them is enough
in practice; they stop early once the estimate stops moving.

Use it: start the coordinator and every node with ``--plugins geomedian`` (the coordinator
alone aggregates, but nodes check the run's settings, the rule's name among them) and set::

    aggregation:
      rule: geomedian:geometric_median
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

MAX_ITERATIONS = 10
TOLERANCE = 1e-6  # stop once an iteration moves the estimate less than this, relatively
SMOOTHING = 1e-8  # least distance counted: an update at the estimate keeps a finite weight


def geometric_median(updates: Sequence[Mapping[str, np.ndarray]],
                     samples: Sequence[int]) -> dict[str, np.ndarray]:
    """The sample-weighted geometric median of ``updates`` (name -> array each), by at most
    MAX_ITERATIONS Weiszfeld iterations; float64 tensors of the updates' shapes."""
    names = list(updates[0])
    points = np.stack([np.concatenate([np.asarray(u[n], dtype=np.float64).ravel()
                                       for n in names]) for u in updates])
    weights = np.asarray(samples, dtype=np.float64) / float(sum(samples))
    median = weights @ points  # the weighted mean, where Weiszfeld starts
    for _ in range(MAX_ITERATIONS):
        distances = np.maximum(np.linalg.norm(points - median, axis=1), SMOOTHING)
        pull = weights / distances
        moved = pull @ points / pull.sum()
        step = np.linalg.norm(moved - median)
        median = moved
        if step <= TOLERANCE * max(np.linalg.norm(median), SMOOTHING):
            break
    return _unflatten(median, names, updates[0])


def _unflatten(flat: np.ndarray, names: list[str],
               like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``flat`` cut back into tensors of the names and shapes of ``like``."""
    result, start = {}, 0
    for name in names:
        shape = np.shape(like[name])
        size = int(np.prod(shape))
        result[name] = flat[start:start + size].reshape(shape)
        start += size
    return result
