"""The dashboard's reading of a run's folder while the run writes it."""

from __future__ import annotations

import json
from pathlib import Path

from thrift_trainer.dashboard import run_files


def _write(run_dir: Path, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text(text, encoding="utf-8")


def test_rows_skip_a_line_being_written_and_damaged_ones(tmp_path: Path) -> None:
    rows = [{"round": 1, "validation_error": 0.5}, {"round": 2, "validation_error": 0.4}]
    _write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows) + "not json\n"
           + '["a list"]\n' + '{"round": 3, "validation_er')
    assert run_files.metrics_rows(tmp_path) == rows
    assert run_files.last_metrics_row(tmp_path) == rows[-1]


def test_nan_reads_as_none(tmp_path: Path) -> None:
    _write(tmp_path, '{"round": 1, "validation_error": NaN, "fid_features": Infinity}\n')
    assert run_files.metrics_rows(tmp_path) == [
        {"round": 1, "validation_error": None, "fid_features": None}]


def test_a_rounds_phases_become_a_series_each(tmp_path: Path) -> None:
    _write(tmp_path, '{"round": 1, "seconds": 0.5, "phase_seconds": {"plan": 0.01, '
           '"units": 0.4, "odd": "text"}}\n')
    assert run_files.metrics_rows(tmp_path) == [
        {"round": 1, "seconds": 0.5, "phase_plan": 0.01, "phase_units": 0.4}]


def test_the_last_row_of_a_long_file_is_read_from_its_end(tmp_path: Path) -> None:
    lines = [json.dumps({"round": i, "train_loss": i / 7}) + "\n" for i in range(1, 5001)]
    _write(tmp_path, "".join(lines))
    assert (tmp_path / "metrics.jsonl").stat().st_size > 10 * run_files.TAIL_BYTES
    assert run_files.last_metrics_row(tmp_path) == {"round": 5000, "train_loss": 5000 / 7}


def test_a_run_without_files_has_no_rows_and_no_samples(tmp_path: Path) -> None:
    assert run_files.metrics_rows(tmp_path) == []
    assert run_files.last_metrics_row(tmp_path) is None
    assert run_files.sample_rounds(tmp_path) == []


def test_sample_rounds_are_the_grids_written(tmp_path: Path) -> None:
    for round_index in (20, 5, 100000):
        path = run_files.sample_path(tmp_path, round_index)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"png")
    (tmp_path / "samples" / "round_7.png.tmp").write_bytes(b"")
    assert run_files.sample_rounds(tmp_path) == [5, 20, 100000]
