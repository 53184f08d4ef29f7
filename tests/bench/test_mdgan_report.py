"""bench/mdgan_paper.py's seeds: where each seed's run is kept, and the report's mean and
standard deviation over the seeds finished (from stored results; no process started)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import mdgan_paper  # noqa: E402

SETTINGS = mdgan_paper.Settings(batch=32, eval_every=1000, eval_n=100, seed=1, cnn="dcgan28",
                                mlp="mlpgan28")


def _standalone(batch: int) -> mdgan_paper.Experiment:
    return mdgan_paper.Experiment(f"cnn-standalone-b{batch}-i2000", f"standalone b={batch}",
                                  "standalone", "dcgan28", 1, batch, 2000)


def _store(out: Path, exp: mdgan_paper.Experiment, seed: int, fids: list[float]) -> None:
    curve = [{"iteration": 1000 * (i + 1), "inception_score": 2.0 + seed,
              "fid_features": fid, "fid_logits": fid / 4} for i, fid in enumerate(fids)]
    mdgan_paper.save_result(out, exp, dataclasses.replace(SETTINGS, seed=seed),
                            {"curve": curve, "seconds": 10.0 * seed})


def test_seed_one_keeps_its_file_name_and_other_seeds_get_their_own(tmp_path: Path) -> None:
    exp = _standalone(32)
    assert mdgan_paper.result_path(tmp_path, exp, 1).name == f"{exp.key}.json"
    assert mdgan_paper.result_path(tmp_path, exp, 3).name == f"{exp.key}-s3.json"
    _store(tmp_path, exp, 3, [200.0, 150.0])
    assert mdgan_paper.is_done(tmp_path, exp, dataclasses.replace(SETTINGS, seed=3))
    assert not mdgan_paper.is_done(tmp_path, exp, SETTINGS)


def test_seeds_and_report_points_are_read_from_the_command_line() -> None:
    args = mdgan_paper.parse_args(["--seeds", "1,2,3", "--at", "1000,3000"])
    assert args.seeds == [1, 2, 3] and args.at == [1000, 3000]
    assert mdgan_paper.parse_args([]).seeds == [1]
    with pytest.raises(SystemExit):
        mdgan_paper.parse_args(["--seeds", "one"])


def test_the_table_gives_mean_and_deviation_over_the_seeds_finished(tmp_path: Path) -> None:
    two_seeds, one_seed = _standalone(32), _standalone(160)
    md_gan = mdgan_paper.Experiment("cnn-n5-mdgan-k2-i2000", "MD-GAN N=5 k=2", "md_gan",
                                    "dcgan28", 5, 32, 2000, k=2)
    _store(tmp_path, two_seeds, 1, [300.0, 100.0])
    _store(tmp_path, two_seeds, 2, [340.0, 120.0])
    _store(tmp_path, one_seed, 1, [250.0, 90.0])
    _store(tmp_path, md_gan, 1, [280.0, 95.0])
    page = tmp_path / "page.md"
    mdgan_paper.write_report({"test": [two_seeds, one_seed, md_gan],
                              "alone": [two_seeds, one_seed]}, SETTINGS, tmp_path, page,
                             tmp_path / "images", seeds=[1, 2, 3], at=None)
    text = page.read_text()
    # a group whose own runs have not finished is left out: its standalone runs are shared
    assert "### Group test" in text and "### Group alone" not in text
    assert "| MD-GAN N=5 k=2 | 5 | 2 | 32 | 1 | 280.0 | 95.0 | 3.00 | 10 |" in text
    assert "| FID feat. @ 1,000 | FID feat. @ 2,000 | IS @ 2,000 |" in text
    # 300 and 340: mean 320, sample standard deviation 28.3; IS 3 and 4
    assert "| standalone b=32 | 1 | - | 32 | 2 | 320.0 ± 28.3 | 110.0 ± 14.1 | " \
           "3.50 ± 0.71 | 15 |" in text
    assert "| standalone b=160 | 1 | - | 160 | 1 | 250.0 | 90.0 | 3.00 | 10 |" in text
    assert (tmp_path / "images" / "mdgan_test.png").stat().st_size > 1000


def test_the_curve_keeps_the_updates_every_seed_scored() -> None:
    runs = [{"curve": [{"iteration": i, "fid_features": f} for i, f in pts]}
            for pts in ([(250, 10.0), (500, 6.0)], [(250, 14.0)])]
    assert mdgan_paper.seed_curve(runs, "fid_features") == ([250], [12.0],
                                                            [pytest.approx(2.828, abs=1e-3)])
