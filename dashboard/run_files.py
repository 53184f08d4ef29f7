"""What a run's folder holds, read for the dashboard: metrics rows and sample grids.

The run writes these files while the dashboard reads them, so a line being appended
(no newline yet) or damaged is skipped rather than failing the page.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from thrift_trainer.coordinator.checkpoint import METRICS_FILE
from thrift_trainer.engine.phase_clock import PHASES_KEY

SAMPLES_DIR = "samples"
SAMPLE_NAME = re.compile(r"^round_(\d{5,})\.png$")
TAIL_BYTES = 16384  # enough for a run's last metrics row, however long the file


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete, readable row of the run's metrics file, in file order."""
    try:
        text = (run_dir / METRICS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return _rows(text.splitlines(keepends=True))


def last_metrics_row(run_dir: Path) -> dict[str, Any] | None:
    """The last complete row, reading only the end of the file."""
    try:
        with open(run_dir / METRICS_FILE, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    rows = _rows(tail.splitlines(keepends=True))
    return rows[-1] if rows else None


def _rows(lines: list[str]) -> list[dict[str, Any]]:
    rows = []
    for line in lines:
        if not line.endswith("\n"):  # still being written
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("round"), int):
            rows.append({k: _finite(v) for k, v in _flat(row).items()})
    return rows


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """The round's phases (one object in the file) as a series each: ``phase_units``..."""
    phases = row.pop(PHASES_KEY, None)
    if isinstance(phases, dict):
        row.update({f"phase_{name}": value for name, value in phases.items()
                    if isinstance(value, (int, float)) and not isinstance(value, bool)})
    return row


def _finite(value: Any) -> Any:
    """NaN and infinities (rounds without an evaluation) as None, which JSON can carry."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def sample_rounds(run_dir: Path) -> list[int]:
    """Rounds that have a sample grid, in order."""
    try:
        names = [p.name for p in (run_dir / SAMPLES_DIR).iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := SAMPLE_NAME.match(name)))


def sample_path(run_dir: Path, round_index: int) -> Path:
    """Where the run writes its grid of this round (see coordinator.run)."""
    return run_dir / SAMPLES_DIR / f"round_{round_index:05d}.png"
