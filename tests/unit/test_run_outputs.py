"""Output settings, schedules and the PNG writers of a run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from thrift_trainer.training.outputs.plots import (
    check_outputs,
    curve_panels,
    curve_series,
    curves_figure,
    due,
    metrics_line,
    save_curves,
    save_grid,
)


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


def test_curves_plot_only_measured_metrics_as_lines_through_their_rounds():
    # eval_every 2: scores and the validation error exist every other round only
    rows = [{"round": r, "validation_error": 0.5 / r if r % 2 == 0 else math.nan,
             "train_loss": 1.0 / r, "inception_score": 2.0 + r if r % 2 == 0 else None,
             "n": 500} for r in range(1, 7)]
    series = curve_series(rows)
    assert list(series) == ["validation_error", "train_loss", "inception_score"]  # no n
    assert series["validation_error"] == ([2, 4, 6], [0.25, 0.125, 0.5 / 6])
    assert series["train_loss"][0] == [1, 2, 3, 4, 5, 6]


def test_metrics_lines_are_json_with_null_for_unmeasured_values():
    line = metrics_line({"round": 3, "validation_error": math.nan, "fid": math.inf,
                         "train_loss": 0.25, "discarded": []})
    assert "NaN" not in line and "Infinity" not in line and line.endswith("\n")
    assert json.loads(line) == {"round": 3, "validation_error": None, "fid": None,
                                "train_loss": 0.25, "discarded": []}


def test_a_null_metric_reads_back_as_nan_when_a_run_resumes():
    from thrift_trainer.coordinator.checkpoint import metrics_of

    row = json.loads(metrics_line({"round": 2, "validation_error": math.nan,
                                   "validation_loss": math.nan, "train_loss": 0.5,
                                   "seconds": 1.0, "inception_score": 2.5}))
    metrics = metrics_of(row)
    assert math.isnan(metrics.validation_error) and math.isnan(metrics.validation_loss)
    assert metrics.train_loss == 0.5 and metrics.scores == {"inception_score": 2.5}


def test_curves_have_a_title_losses_on_one_panel_and_sizes_drawn_from_zero():
    """Before: no title, training and validation loss apart, and a bytes axis that made a
    500-byte change in 400 kB look like a cliff."""
    rows = [{"round": r, "validation_error": 0.5 / r, "validation_loss": 2.0 / r,
             "train_loss": 1.5 / r, "bytes_up": 400_000 + 100 * r, "bytes_down": 180_000}
            for r in range(1, 6)]
    assert curve_panels(curve_series(rows)) == {
        "validation_error": ["validation_error"], "loss": ["validation_loss", "train_loss"],
        "bytes per round": ["bytes_up", "bytes_down"]}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = curves_figure(rows, "run r1: delta_avg, model mlp, data letters")
    FigureCanvasAgg(fig).draw()
    assert fig._suptitle.get_text() == "run r1: delta_avg, model mlp, data letters"
    error, loss, sizes = fig.axes
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["validation", "training"]
    assert sizes.get_ylim()[0] == 0 and sizes.get_ylim()[1] > 400_500
    assert sizes.yaxis.get_offset_text().get_text() == ""  # no "+4e5" above the axis
    # every tick label inside the figure: the fixed margins leave room for them
    width, height = fig.canvas.get_width_height()
    for axis in fig.axes:
        for label in [*axis.get_yticklabels(), axis.yaxis.label, axis.xaxis.label]:
            box = label.get_window_extent()
            assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height
