"""Output settings, schedules and the PNG writers of a run."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from training.run_outputs import check_outputs, due, save_curves, save_grid


def test_output_settings_fill_defaults_and_name_bad_keys():
    assert check_outputs({"eval_every": 5})["eval_every"] == 5
    assert check_outputs({})["checkpoint_every"] == 1
    with pytest.raises(ValueError, match="unknown outputs key 'eval_evry'"):
        check_outputs({"eval_evry": 5})
    with pytest.raises(ValueError, match="'eval_n' must be an integer"):
        check_outputs({"eval_n": "many"})


def test_periodic_outputs_are_due_on_multiples_and_after_the_last_round():
    assert [r for r in range(1, 8) if due(3, r, last_round=7)] == [3, 6, 7]
    assert not any(due(0, r, last_round=7) for r in range(1, 8))


def test_grid_tiles_images_with_gaps(tmp_path):
    images = np.linspace(-1, 1, 10 * 3 * 4 * 5).reshape(10, 3, 4, 5)
    path = save_grid(images, tmp_path / "g" / "grid.png", columns=4)
    with Image.open(path) as grid:
        assert grid.size == (4 * 7 + 2, 3 * 6 + 2) and grid.mode == "RGB"
    grey = save_grid(np.zeros((2, 1, 3, 3)), tmp_path / "grey.png", columns=2)
    with Image.open(grey) as grid:
        assert grid.mode == "L" and np.asarray(grid)[2, 2] == 128


def test_curves_plot_every_numeric_metric(tmp_path):
    rows = [{"round": r, "validation_error": 1 / r, "fid_features": 100 / r if r % 2 else None}
            for r in range(1, 5)]
    path = save_curves(rows, tmp_path / "curves.png")
    with Image.open(path) as image:
        assert image.size[1] > image.size[0] * 0.5  # two panels stacked
