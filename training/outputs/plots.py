"""What a run writes besides metrics: sample grids and curves, as PNG files.

Pillow draws the grids and matplotlib (headless Agg backend) the curves; both are imported
only when a run writes such a file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.schema import OutputSettings, defaults

MAX_EVAL_N = 100_000  # images generated and scored per evaluation, on the coordinator


def check_outputs(outputs: Mapping[str, Any]) -> dict[str, int]:
    """The output settings with defaults filled in; ValueError naming a bad key."""
    known = defaults(OutputSettings)
    unknown = sorted(set(outputs) - set(known))
    if unknown:
        raise ValueError(f"unknown outputs key {unknown[0]!r}; known: {', '.join(known)}")
    checked = {**known, **outputs}
    for key, value in checked.items():
        if checked_value(f"outputs key {key!r}", value, 0) < 0:
            raise ValueError(f"outputs key {key!r} must be an integer >= 0 (0: never), "
                             f"got {value!r}")
    if checked["eval_n"] > MAX_EVAL_N:
        raise ValueError(f"outputs key 'eval_n' must be at most {MAX_EVAL_N}, "
                         f"got {checked['eval_n']}")
    return checked


def due(every: int, round_index: int, last_round: int) -> bool:
    """Whether a periodic output is due after this round (always after the last one)."""
    return every > 0 and (round_index % every == 0 or round_index == last_round)


def save_grid(images: np.ndarray, path: str | os.PathLike, columns: int = 8) -> Path:
    """Tile images (n, C, H, W) in [-1, 1] into one PNG, `columns` per row."""
    from PIL import Image

    n, channels, height, width = images.shape
    rows = math.ceil(n / columns)
    pixels = ((np.clip(images, -1, 1) + 1) * 127.5).round().astype(np.uint8)
    grid = np.zeros((rows * (height + 2) + 2, columns * (width + 2) + 2, channels), np.uint8)
    for i, image in enumerate(pixels):
        top, left = 2 + (i // columns) * (height + 2), 2 + (i % columns) * (width + 2)
        grid[top:top + height, left:left + width] = image.transpose(1, 2, 0)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[:, :, 0] if channels == 1 else grid).save(target)
    return target


# Row keys that are no metric: the x axis, and the number of images a score was taken on.
NOT_METRICS = frozenset({"round", "n", "discarded"})


def metrics_line(row: Mapping[str, Any]) -> str:
    """One metrics.jsonl line: JSON proper, so a metric not measured this round (NaN) or
    not finite is written as null, never as the NaN token JSON does not have."""
    return json.dumps({k: _json_value(v) for k, v in row.items()}, allow_nan=False) + "\n"


def _json_value(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def curve_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """Each metric's (rounds, values) over the rows where it was measured (a finite number),
    in the rows' key order; keys that are no metric are left out."""
    names = dict.fromkeys(k for row in rows for k in row if k not in NOT_METRICS)
    series = {}
    for name in names:
        kept = [row for row in rows if _is_measured(row.get(name))]
        if kept:
            series[name] = ([row["round"] for row in kept], [float(row[name]) for row in kept])
    return series


# Metrics drawn together on one panel (a legend tells them apart), under the panel's label.
PANELS = {"train_loss": "loss", "validation_loss": "loss",
          "bytes_up": "bytes per round", "bytes_down": "bytes per round"}
LEGEND = {"train_loss": "training", "validation_loss": "validation", "bytes_up": "up",
          "bytes_down": "down"}
FROM_ZERO = frozenset({"bytes per round", "seconds"})  # sizes: a small change stays small
CURVES_WIDTH = 7.0  # inches


def curve_panels(series: Mapping[str, tuple[list[int], list[float]]]
                 ) -> dict[str, list[str]]:
    """The panels of the curves, in the metrics' order: the label of each and the metrics
    it draws (training and validation loss together, bytes up and down together)."""
    panels: dict[str, list[str]] = {}
    for name in series:
        panels.setdefault(PANELS.get(name, name), []).append(name)
    return panels


def save_curves(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike,
                title: str = "") -> Path:
    """The rounds' metrics (x axis: round) on one panel each, training and validation loss
    on a shared one, each drawn as a line through the rounds where it was measured with a
    marker on each; ``title``: the figure's (the run, its algorithm and model). Sizes
    (bytes, seconds) are drawn from 0 and no axis shows an offset, so that a change of
    500 bytes in 400 kB looks as small as it is."""
    target = Path(path)
    curves_figure(rows, title).savefig(target, dpi=100)
    return target


def curves_figure(rows: Sequence[Mapping[str, Any]], title: str = "") -> Any:
    """The matplotlib figure `save_curves` writes: a plain Figure, drawn by Agg, that no
    pyplot state holds (nothing to close)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = curve_series(rows)
    panels = curve_panels(series)
    count = max(1, len(panels))
    height = 0.5 + 2.2 * count
    fig = Figure(figsize=(CURVES_WIDTH, height))
    axes = fig.subplots(count, 1, sharex=True, squeeze=False)
    for axis, (label, names) in zip(axes[:, 0], panels.items(), strict=False):
        for name in names:
            rounds, values = series[name]
            axis.plot(rounds, values, marker="o", markersize=3, linewidth=1.2,
                      label=LEGEND.get(name, name))
        axis.set_ylabel(label)
        axis.ticklabel_format(axis="y", useOffset=False, style="plain")
        if label in FROM_ZERO:
            highest = max(v for n in names for v in series[n][1])
            axis.set_ylim(bottom=0, top=highest * 1.1 or 1.0)
        if len(names) > 1:
            axis.legend(loc="best", fontsize="small")
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("round")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))  # no round 1.5
    if title:
        fig.suptitle(title)
    # Fixed margins, in inches, that fit tick labels of 8 characters: tight_layout measured
    # every label by drawing the figure once more, half of the cost of a run's curves.
    fig.subplots_adjust(left=1.05 / CURVES_WIDTH, right=1 - 0.2 / CURVES_WIDTH,
                        bottom=0.55 / height, top=1 - (0.5 if title else 0.25) / height,
                        hspace=0.12)
    return fig


def _is_measured(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
