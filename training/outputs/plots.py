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
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
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


def save_curves(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """One panel per metric of the rounds' rows (x axis: round), drawn as a line through
    the rounds where it was measured, with a marker on each."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    series = curve_series(rows)
    fig, axes = plt.subplots(max(1, len(series)), 1, figsize=(7, 2.2 * max(1, len(series))),
                             sharex=True, squeeze=False)
    for i, (name, (rounds, values)) in enumerate(series.items()):
        axes[i, 0].plot(rounds, values, marker="o", markersize=3, linewidth=1.2)
        axes[i, 0].set_ylabel(name)
        axes[i, 0].grid(alpha=0.3)
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def _is_measured(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
