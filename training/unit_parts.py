"""A unit cut into shares for a node's local workers, and the shares' results combined.

A node started with `--workers W` (compute_node/local_workers.py) gives each of its W
worker processes one share of a unit. An algorithm that can compute a share sets
`Algorithm.splits_units` and implements `run_unit_part`; the node combines the shares'
results by their sample-weighted mean (an all-reduce inside the machine). For a mean
gradient (sync_sgd) that mean is the unit's gradient up to float rounding; for local
training (delta_avg, fl_gan) it is local averaging of W shorter trainings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from thrift_trainer.training import aggregation
from thrift_trainer.training.units import UnitOutput


def part_bounds(size: int, part: int, parts: int, block: int = 1) -> tuple[int, int]:
    """Rows [lo, hi) of share `part` of `parts` of `size` rows, cut at multiples of `block`
    (a micro-batch: a share then holds whole micro-batches, as a single worker's pass
    does). Earlier shares get the extra blocks, so share 0 is empty only when `size` is 0."""
    if not 0 <= part < parts:
        raise ValueError(f"share {part} of {parts} does not exist")
    blocks = -(-size // block)
    base, extra = divmod(blocks, parts)
    first = part * base + min(part, extra)
    last = first + base + (part < extra)
    return min(first * block, size), min(last * block, size)


def weighted_mean(outputs: Sequence[UnitOutput]) -> UnitOutput:
    """The shares' results as one: updates, loss and error averaged with the shares'
    sample counts as weights (in float64, then each tensor back to its dtype; integer
    tensors such as BatchNorm's batch counter are rounded)."""
    total = sum(o.num_samples for o in outputs)
    if total < 1:
        raise ValueError("no share of the unit holds a sample")
    mean = aggregation.weighted_mean([o.update for o in outputs],
                                     [o.num_samples for o in outputs])
    update = {name: cast_like(value, outputs[0].update[name].dtype)
              for name, value in mean.items()}
    return UnitOutput(update=update, num_samples=total,
                      loss=sum(o.loss * o.num_samples for o in outputs) / total,
                      error=sum(o.error * o.num_samples for o in outputs) / total)


def cast_like(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`value` in `dtype`, rounded first when that is an integer type."""
    if not np.issubdtype(dtype, np.floating):
        value = np.rint(value)
    return np.array(value, dtype=dtype, order="C")  # keeps a 0-d tensor 0-d
