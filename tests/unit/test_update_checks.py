"""An update's values are tested for NaN and infinities a block at a time."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.training import update_checks
from thrift_trainer.training.update_checks import all_finite, check_update_form


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_value_that_is_not_finite_is_found_in_any_block(monkeypatch, bad):
    monkeypatch.setattr(update_checks, "FINITE_BLOCK", 4)
    value = np.zeros((3, 5), np.float32)
    assert all_finite(value)
    value[2, 4] = bad  # in the last, partial block
    assert not all_finite(value)
    with pytest.raises(ValueError, match="'w' holds NaN or infinite values"):
        check_update_form({"w": value}, None)


def test_integers_booleans_and_empty_tensors_are_finite():
    for value in (np.arange(7), np.array([True, False]), np.zeros((0, 3)), np.array(2.5)):
        assert all_finite(value)
