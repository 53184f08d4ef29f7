"""bench/gan_quality.py keeps each run's state: a longer run goes on from a shorter one
and ends where a run of that length from scratch ends (the standalone arm, in process)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gan_quality  # noqa: E402

from thrift_trainer.training.outputs.plots import save_grid  # noqa: E402

pytestmark = pytest.mark.slow


def _baseline(out: Path, updates: int) -> list[dict]:
    assert gan_quality.main(["--model", "dcgan28-tiny", "--updates", str(updates),
                             "--eval-every", "2", "--seeds", "1", "--n", "100", "--arms",
                             "baseline", "--out", str(out)]) == 0
    (record,) = [json.loads(p.read_text()) for p in out.glob(f"baseline_seed1_{updates}_*.json")]
    return record["curve"]


def test_a_longer_run_goes_on_from_the_kept_state_and_ends_as_a_fresh_one(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _baseline(tmp_path / "extended", 4)
    extended = _baseline(tmp_path / "extended", 6)
    assert "going on after update 4" in capsys.readouterr().err
    fresh = _baseline(tmp_path / "fresh", 6)
    assert [row["updates"] for row in extended] == [2, 4, 6]
    for kept, new in zip(extended, fresh, strict=True):  # the same maths, continued
        assert kept == pytest.approx(new)


def test_a_kept_run_longer_than_asked_is_not_used(tmp_path: Path) -> None:
    _baseline(tmp_path, 4)
    assert [row["updates"] for row in _baseline(tmp_path, 2)] == [2]


def test_the_system_arm_goes_on_with_its_kept_run_as_far_as_asked(tmp_path: Path) -> None:
    run_dir = tmp_path / "state" / "system_seed1_x" / "runs" / gan_quality.RUN_ID
    assert gan_quality.resume_arguments(run_dir, 10) == []  # nothing kept: a fresh run
    run_dir.mkdir(parents=True)
    (run_dir / "request.json").write_text(json.dumps({"rounds": 10}))
    assert gan_quality.resume_arguments(run_dir, 10) == ["--resume", gan_quality.RUN_ID]
    assert gan_quality.resume_arguments(run_dir, 20) == [
        "--resume", gan_quality.RUN_ID, "--rounds", "20"]
    (run_dir / "model.npz").write_bytes(b"")  # the run ended
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"round": r}) + "\n" for r in range(1, 11)))
    assert gan_quality.resume_arguments(run_dir, 10) is None
    (run_dir / "request.json").write_text(json.dumps({"rounds": 20}))  # extended, cut off
    assert gan_quality.resume_arguments(run_dir, 20) == ["--resume", gan_quality.RUN_ID]
    (run_dir / "request.json").write_text(json.dumps({"rounds": 10}))
    assert gan_quality.resume_arguments(run_dir, 5) == []  # longer than asked: removed
    assert not (tmp_path / "state" / "system_seed1_x").exists()


def test_grids_come_from_the_kept_state_of_a_finished_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = tmp_path / "images"
    images.mkdir()
    monkeypatch.setattr(gan_quality, "IMAGES", images)
    argv = ["--model", "dcgan28-tiny", "--updates", "4", "--seeds", "1", "--n", "100",
            "--arms", "baseline", "--out", str(tmp_path / "out"), "--grids"]
    assert gan_quality.main(argv) == 0
    grid = images / "gan_quality_dcgan28-tiny_4_baseline_seed1.png"
    trained = grid.read_bytes()
    grid.unlink()
    assert gan_quality.main(argv) == 0  # finished: nothing trains, the grid comes back
    assert grid.read_bytes() == trained
    untrained = gan_quality.baseline_algorithm(
        argparse.Namespace(model="dcgan28-tiny", k=3, unit=32, sets={}), 1)
    save_grid(untrained.sample_images(untrained.initial_weights(), 64, seed=2024),
              tmp_path / "untrained.png")
    assert (tmp_path / "untrained.png").read_bytes() != trained


def _runs(*curves: list[float], every: int = 500) -> list[dict]:
    return [{"curve": [{"updates": every * (i + 1), "fid_features": fid}
                       for i, fid in enumerate(curve)]} for curve in curves]


def test_the_plateau_check_fits_the_mean_of_the_seeds_over_the_window() -> None:
    # The mean falls 10 per 1,000 updates from 110 to 60: 10 / 60 at the end of the fit.
    falling = _runs([110, 105, 100, 95, 90, 85, 80, 75, 70, 65, 60],
                    [100, 95, 90, 85, 80, 75, 70, 65, 60, 55, 50],
                    [120, 115, 110, 105, 100, 95, 90, 85, 80, 75, 70])
    assert gan_quality.improvement_per_1000(falling, 3000) == pytest.approx(10 / 60)
    # Noise around a level: a single-point drop at the end does not read as progress.
    flat = _runs([40, 30, 45, 35, 40, 30, 45, 25])
    assert abs(gan_quality.improvement_per_1000(flat, 3000)) < 0.05
    assert "plateau" in gan_quality.plateau_report({"baseline": flat}, 3000)
    assert "still improving" in gan_quality.plateau_report({"baseline": falling}, 3000)
    assert gan_quality.improvement_per_1000(_runs([50, 40]), 3000) is None


def test_the_final_level_averages_each_run_over_the_window_and_compares_the_arms() -> None:
    system = _runs([90, 60, 40, 20], [90, 60, 40, 40])  # evaluations at 500 ... 2,000
    baseline = _runs([90, 60, 50, 30], [90, 60, 50, 30])
    assert gan_quality.final_level(system[0], 500) == pytest.approx(30)  # 1,500 and 2,000
    report = gan_quality.plateau_report({"system": system, "baseline": baseline}, 500)
    assert "system: mean FID over the last 500 updates 35.0 ± 7.1" in report
    assert "system / baseline, last 500 updates: 0.875" in report
