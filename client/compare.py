"""Comparing finished runs: a table of their final and best figures and one picture of their
curves overlaid (`client.py compare RUN...`, and the end of `client.py sweep`).

A run is read from either of the two records a run leaves:
- a coordinator's run folder (`runs/<id>/`: `run.json` and `metrics.jsonl`, with each round's
  bytes), or
- the client's record of a run (`models/<id>.json`, written beside the model file: the result
  as `--json` prints it, with the run's settings).

Runs that differ only in their seed are one *setting*: the table gives their mean and spread
(the sample standard deviation over seeds) and the picture their mean curve with the range
between the lowest and highest seed shaded. The validation metric is the run's
`validation_error` (an error rate, or the loss or MSE a torch model's metric names): lower is
better.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRIC = "validation_error"
RECORD_SUFFIX = ".json"


class CompareError(ValueError):
    """A run that cannot be read, named with what is wrong."""


@dataclass
class RunCurves:
    """One finished run: what it was and its rounds' figures."""

    run_id: str
    algorithm: str
    model: str
    dataset: str
    settings: dict[str, Any]  # the algorithm's settings as the run used them
    rows: list[dict[str, Any]]  # per round: round, validation_error, losses, seconds, bytes
    seed: int | None = None
    label: str = field(default="")  # the setting it belongs to, seed left out

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(rounds, values) of `key` over the rounds where it was measured."""
        kept = [row for row in self.rows if _finite(row.get(key))]
        return [row["round"] for row in kept], [float(row[key]) for row in kept]

    def identity(self) -> dict[str, Any]:
        """What makes the run's setting: algorithm, model, data and settings, not the seed."""
        settings = {k: v for k, v in self.settings.items() if k != "seed"}
        return {"algorithm": self.algorithm, "model": self.model, "dataset": self.dataset,
                **settings}

    def cumulative(self, key: str) -> list[float] | None:
        """The running total of `key` per round, or None when some round lacks it."""
        if not self.rows or not all(_finite(row.get(key)) for row in self.rows):
            return None
        total, out = 0.0, []
        for row in self.rows:
            total += float(row[key])
            out.append(total)
        return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


# ------------------------------------------------------------------------ reading runs
def load_run(where: str | Path, search: Sequence[Path] = ()) -> RunCurves:
    """The run at `where`: a run folder, a client's record file, or a run id looked up in
    each folder of `search` (as `<folder>/<id>/` or `<folder>/<id>.json`)."""
    path = Path(where)
    if not path.exists():
        found = [candidate for folder in search
                 for candidate in (folder / str(where), folder / f"{where}{RECORD_SUFFIX}")
                 if candidate.exists()]
        if not found:
            looked = ", ".join(str(folder) for folder in search) or "nowhere"
            raise CompareError(f"{where}: no such run folder or record (looked in {looked})")
        path = found[0]
    run = _load_folder(path) if path.is_dir() else _load_record(path)
    if not run.rows:
        raise CompareError(f"{path}: the run has no finished round to compare")
    run.seed = _seed_of(run.settings)
    return run


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CompareError(f"{path}: cannot be read ({exc})") from None


def _load_folder(folder: Path) -> RunCurves:
    """A coordinator's run folder."""
    if not (folder / "run.json").is_file() or not (folder / "metrics.jsonl").is_file():
        raise CompareError(f"{folder}: not a run folder (it needs run.json and metrics.jsonl)")
    meta = _read_json(folder / "run.json")
    rows = []
    for number, line in enumerate((folder / "metrics.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise CompareError(f"{folder / 'metrics.jsonl'}:{number}: not JSON") from None
        row["bytes"] = (row.get("bytes_down") or 0) + (row.get("bytes_up") or 0)
        rows.append(row)
    return RunCurves(str(meta.get("run_id", folder.name)), str(meta.get("algorithm", "?")),
                     str(meta.get("model", "?")), str(meta.get("dataset", "?")),
                     dict(meta.get("config") or {}), rows)


def _load_record(path: Path) -> RunCurves:
    """A client's record of a run (`models/<id>.json`)."""
    record = _read_json(path)
    if not isinstance(record, dict) or "result" not in record or "run" not in record:
        raise CompareError(f"{path}: not a run record (one written beside a model file by "
                           f"client.py, with 'run' and 'result')")
    run, result = record["run"], record["result"]
    return RunCurves(str(result.get("run_id", path.stem)), str(run.get("algorithm", "?")),
                     str(run.get("model", "?")), str(run.get("dataset", "?")),
                     dict(run.get("settings") or {}), list(result.get("history") or []))


def _seed_of(settings: dict[str, Any]) -> int | None:
    seed = settings.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def label_runs(runs: Sequence[RunCurves]) -> None:
    """Name each run's setting by what sets it apart from the others (seed left out); runs
    with the same label are seeds of one setting."""
    flat = [_flat(run.identity()) for run in runs]
    keys = sorted({k for values in flat for k in values})
    differing = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True)
                                          for f in flat}) > 1]
    for run, values in zip(runs, flat, strict=True):
        parts = [f"{k}={_short(values.get(k))}" for k in differing]
        run.label = " ".join(parts) or run.algorithm



def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else json.dumps(value)


# ------------------------------------------------------------------------ the table
@dataclass
class SettingFigures:
    """A setting's figures over its seeds."""

    label: str
    runs: list[RunCurves]

    def values(self, figure: str) -> list[float]:
        return [v for v in (_figure(run, figure) for run in self.runs) if v is not None]


FIGURES = ("final", "best", "best_round", "train_loss", "seconds", "mib")


def _figure(run: RunCurves, figure: str) -> float | None:
    rounds, values = run.series(METRIC)
    if figure == "final":
        return values[-1] if values else None
    if figure in ("best", "best_round"):
        if not values:
            return None
        best = min(range(len(values)), key=values.__getitem__)
        return values[best] if figure == "best" else float(rounds[best])
    if figure == "train_loss":
        losses = run.series("train_loss")[1]
        return losses[-1] if losses else None
    total = run.cumulative("seconds" if figure == "seconds" else "bytes")
    if total is None:
        return None
    return total[-1] if figure == "seconds" else total[-1] / 2**20


def settings_of(runs: Sequence[RunCurves]) -> list[SettingFigures]:
    """The runs grouped by setting, in the order each setting first appears."""
    groups: dict[str, list[RunCurves]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return [SettingFigures(label, members) for label, members in groups.items()]


def summary(settings: Sequence[SettingFigures]) -> list[dict[str, Any]]:
    """Per setting: its runs and seeds, and each figure's mean and spread (None when no run
    has it; spread 0 for one run)."""
    rows = []
    for setting in settings:
        row: dict[str, Any] = {"setting": setting.label,
                               "runs": [run.run_id for run in setting.runs],
                               "seeds": [run.seed for run in setting.runs]}
        for figure in FIGURES:
            values = setting.values(figure)
            row[figure] = statistics.fmean(values) if values else None
            row[f"{figure}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The summary as aligned text lines, best final metric first."""
    ordered = sorted(rows, key=lambda r: (r["final"] is None, r["final"] or 0.0))
    header = ["setting", "runs", f"final {METRIC}", "best (round)", "train loss", "wall s",
              "MiB"]
    body = [[r["setting"], str(len(r["runs"])), _mean_spread(r, "final"),
             _best(r), _mean_spread(r, "train_loss"), _mean_spread(r, "seconds", 1),
             _mean_spread(r, "mib", 2)] for r in ordered]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
            .rstrip() for line in [header, *body]]


def _mean_spread(row: dict[str, Any], figure: str, digits: int = 4) -> str:
    if row[figure] is None:
        return "-"
    text = f"{row[figure]:.{digits}f}"
    return text + (f" ± {row[figure + '_std']:.{digits}f}" if len(row["runs"]) > 1 else "")


def _best(row: dict[str, Any]) -> str:
    if row["best"] is None:
        return "-"
    return f"{_mean_spread(row, 'best')} ({row['best_round']:.0f})"


# ------------------------------------------------------------------------ the picture
def save_comparison(settings: Sequence[SettingFigures], path: str | Path,
                    title: str = "") -> Path:
    """One figure: the validation metric against rounds, wall seconds and bytes, and the
    training loss against rounds; a setting's mean over its seeds, its range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [(axes[0, 0], METRIC, "round"), (axes[0, 1], "train_loss", "round"),
              (axes[1, 0], METRIC, "seconds"), (axes[1, 1], METRIC, "bytes")]
    for ax, key, x in panels:
        drawn = [_draw(ax, setting, key, x) for setting in settings]
        ax.set_xlabel({"round": "round", "seconds": "wall seconds",
                       "bytes": "MiB sent and received"}[x])
        ax.set_ylabel(key.replace("_", " "))
        ax.grid(alpha=0.3)
        if x == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not any(drawn):
            ax.text(0.5, 0.5, f"no per-round {x} in these runs' records\n(the coordinator's "
                    "run folders have them)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="gray")
        elif _spans_decades(ax):
            ax.set_yscale("log")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8)
    fig.suptitle(title or f"{len(settings)} settings compared")
    fig.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(labels) / 3), 1, 0.97))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def _spans_decades(ax: Any) -> bool:
    """Whether the curves drawn on `ax` are positive and span over two decades (a diverging
    setting would flatten the others on a linear axis)."""
    values = [y for line in ax.get_lines() for y in line.get_ydata()]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _draw(ax: Any, setting: SettingFigures, key: str, x: str) -> bool:
    """The setting's mean curve of `key` against `x` and the range of its seeds; False when
    none of its runs has the figures."""
    curves = [_curve(run, key, x) for run in setting.runs]
    curves = [c for c in curves if c is not None]
    if not curves:
        return False
    length = min(len(xs) for xs, _ in curves)
    xs = [statistics.fmean(c[0][i] for c in curves) for i in range(length)]
    ys = [[c[1][i] for c in curves] for i in range(length)]
    line, = ax.plot(xs, [statistics.fmean(v) for v in ys], marker="o", markersize=2.5,
                    linewidth=1.2, label=f"{setting.label} ({len(curves)} run"
                                         f"{'s' if len(curves) > 1 else ''})")
    if len(curves) > 1:
        ax.fill_between(xs, [min(v) for v in ys], [max(v) for v in ys],
                        color=line.get_color(), alpha=0.15, linewidth=0)
    return True


def _curve(run: RunCurves, key: str, x: str) -> tuple[list[float], list[float]] | None:
    """(x values, key values) over the rounds where `key` was measured."""
    if x == "round":
        rounds, values = run.series(key)
        return ([float(r) for r in rounds], values) if values else None
    totals = run.cumulative(x)
    if totals is None:
        return None
    by_round = {row["round"]: total for row, total in zip(run.rows, totals, strict=True)}
    rounds, values = run.series(key)
    scale = 2**20 if x == "bytes" else 1.0
    return ([by_round[r] / scale for r in rounds], values) if values else None


# ------------------------------------------------------------------------ the command
def compare(runs: Iterable[str | Path], picture: str | Path | None,
            search: Sequence[Path] = (), title: str = "") -> dict[str, Any]:
    """Load the runs, label their settings, write the picture (unless None) and return the
    summary rows and the picture's path."""
    loaded = [load_run(where, search) for where in runs]
    if not loaded:
        raise CompareError("no runs to compare")
    label_runs(loaded)
    settings = settings_of(loaded)
    written = save_comparison(settings, picture, title) if picture is not None else None
    return {"settings": summary(settings), "picture": str(written) if written else None}


def save_record(path: str | Path, request: Any, result: dict[str, Any]) -> Path:
    """Write the client's record of a finished run (what `load_run` reads): the run's
    algorithm, model, data, rounds and settings from its `TrainRequest`, and the result as
    `--json` prints it."""
    run = {"algorithm": request.algorithm, "model": request.model, "dataset": request.dataset,
           "rounds": request.rounds, "settings": json.loads(request.config_json or "{}")}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"run": run, "result": result}, indent=1) + "\n")
    return target
