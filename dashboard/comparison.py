"""The comparison page's data: finished (or running) runs side by side, as `client.py
compare` reads them (client/compare.py): each setting's final and best figures, mean and
spread over its seeds, and each run's curves against rounds, wall seconds and bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thrift_trainer.client.compare import (
    METRIC,
    CompareError,
    RunCurves,
    label_runs,
    load_run,
    settings_of,
    summary,
)
from thrift_trainer.coordinator.run import RUN_ID

MAX_COMPARED = 12  # runs on one page: each is read from its folder, so the cost is bounded


class ComparisonError(ValueError):
    """Runs that cannot be compared, with why in one line."""


def parse_run_ids(text: str | None) -> list[str]:
    """The run ids of `?runs=a,b,c`, checked: at least one, at most MAX_COMPARED, each a
    valid run id (so that it is safe as a folder name), duplicates dropped."""
    ids = list(dict.fromkeys(part.strip() for part in (text or "").split(",") if part.strip()))
    if not ids:
        raise ComparisonError("name the runs to compare: /compare?runs=RUN,RUN")
    if len(ids) > MAX_COMPARED:
        raise ComparisonError(f"at most {MAX_COMPARED} runs can be compared, got {len(ids)}")
    bad = [run_id for run_id in ids if not RUN_ID.match(run_id)]
    if bad:
        raise ComparisonError(f"not a run id: {bad[0]!r}")
    return ids


def comparison(run_root: Path, run_ids: list[str]) -> dict[str, Any]:
    """The settings' table rows and every run's curves."""
    missing = [run_id for run_id in run_ids if not (run_root / run_id).is_dir()]
    if missing:
        raise ComparisonError(f"{missing[0]}: no such run folder on this coordinator")
    try:
        runs = [load_run(run_root / run_id) for run_id in run_ids]
    except CompareError as exc:
        raise ComparisonError(str(exc).replace(str(run_root) + "/", "")) from None
    label_runs(runs)
    return {"metric": METRIC, "settings": summary(settings_of(runs)),
            "runs": [_curves(run) for run in runs]}


def _curves(run: RunCurves) -> dict[str, Any]:
    """A run's per-round figures, the wall seconds and MiB summed up to each round (None
    where a round lacks them)."""
    seconds, traffic = run.cumulative("seconds"), run.cumulative("bytes")
    return {"run_id": run.run_id, "label": run.label, "seed": run.seed,
            "round": [row["round"] for row in run.rows],
            METRIC: [row.get(METRIC) for row in run.rows],
            "train_loss": [row.get("train_loss") for row in run.rows],
            "seconds": seconds, "mib": None if traffic is None else
            [total / 2**20 for total in traffic]}
