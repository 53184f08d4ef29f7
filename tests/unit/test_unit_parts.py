"""Shares of a unit for a node's local workers, and their results combined."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.training.unit_parts import part_bounds, weighted_mean
from thrift_trainer.training.units import UnitOutput


@pytest.mark.parametrize(("size", "parts", "block"), [(320, 2, 32), (330, 2, 32), (100, 3, 1),
                                                      (31, 2, 32), (5, 4, 2), (0, 2, 1)])
def test_shares_cover_the_rows_once_in_order_at_block_bounds(size, parts, block):
    bounds = [part_bounds(size, part, parts, block) for part in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(lo % block == 0 for lo, hi in bounds if hi > lo)
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) < 2 * block  # whole blocks, balanced to one
    assert size == 0 or sizes[0] > 0  # share 0 holds a sample whenever the unit does


def test_a_share_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="share 2 of 2"):
        part_bounds(10, 2, 2)


def test_the_weighted_mean_weighs_by_samples_and_keeps_dtypes():
    a = UnitOutput({"w": np.array([1.0, 2.0], np.float32), "n": np.array(4, np.int64)},
                   num_samples=1, loss=1.0, error=0.0)
    b = UnitOutput({"w": np.array([4.0, 8.0], np.float32), "n": np.array(7, np.int64)},
                   num_samples=3, loss=3.0, error=1.0)
    mean = weighted_mean([a, b])
    assert mean.num_samples == 4 and mean.loss == 2.5 and mean.error == 0.75
    assert mean.update["w"].dtype == np.float32
    np.testing.assert_allclose(mean.update["w"], [3.25, 6.5])
    assert mean.update["n"].dtype == np.int64 and mean.update["n"].shape == ()
    assert mean.update["n"] == 6  # 6.25 rounded
