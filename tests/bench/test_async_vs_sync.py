"""bench/async_vs_sync.py: its arguments and the pure functions that read and time runs
(no process is started)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "async_vs_sync.py"
_SPEC = importlib.util.spec_from_file_location("bench_async_vs_sync", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up
_SPEC.loader.exec_module(bench)


def test_defaults_run_every_mode_on_three_seeds() -> None:
    args = bench.parse_args([])
    assert args.modes == list(bench.DEFAULT_MODES) == [m for m in bench.MODES
                                                        if m != "async-no-backups"]
    assert args.seeds == [1, 2, 3]
    assert args.rounds == 10 and args.target == 0.10
    assert args.server_lr == bench.SERVER_LR
    assert args.json == bench.RESULTS and args.plot == bench.PLOT
    assert args.gan_budget > 0 and args.gan_model == "dcgan28" and args.letters
    assert args.gan_policies == [2, 3]


def test_quick_is_small_and_writes_elsewhere() -> None:
    args = bench.parse_args(["--quick"])
    assert args.rounds == 2 and args.seeds == [1]
    assert args.modes == list(bench.QUICK_MODES)
    assert args.gan_model == "dcgan28-tiny" and args.gan_budget <= 15
    assert args.gan_policies == [2]
    assert args.json == bench.QUICK_RESULTS and args.plot is None
    chosen = bench.parse_args(["--quick", "--modes", "async", "--seeds", "4,5"])
    assert chosen.modes == ["async"] and chosen.seeds == [4]


def test_modes_seeds_and_server_lr_are_checked() -> None:
    args = bench.parse_args(["--modes", "buffered-3,sync-backups", "--seeds", "7,8",
                             "--server-lr", "async=0.05", "--no-letters", "--gan-budget", "0",
                             "--gan-policies", "3,1"])
    assert args.modes == ["buffered-3", "sync-backups"] and args.seeds == [7, 8]
    assert args.server_lr == {**bench.SERVER_LR, "async": 0.05}
    assert not args.letters and args.gan_budget == 0 and args.gan_policies == [3, 1]
    for bad in (["--modes", "async,fast"], ["--modes", "async,async"], ["--seeds", "1,x"],
                ["--seeds", "2,2"], ["--server-lr", "sync-backups=0.5"],
                ["--server-lr", "async=-1"], ["--server-lr", "async"], ["--rounds", "0"],
                ["--gan-eval-every", "0"], ["--gan-policies", "4"],
                ["--gan-policies", "2,2"], ["--gan-policies", ""]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="'async=nan'"):
        bench.parse_server_lr("async=nan")


def test_client_sets_give_only_async_modes_a_server_step() -> None:
    lr = {"async": 0.1, "buffered-2": 0.25}
    assert bench.client_sets("sync-no-backups", lr, 10, 2) == ["run.rounds=10", "run.seed=2"]
    assert bench.client_sets("buffered-2", lr, 5, 1, ["x.y=1"]) == [
        "run.rounds=5", "run.seed=1", "schedule.mode=buffered", "schedule.buffer_size=2",
        "delta_avg.server_lr=0.25", "x.y=1"]
    assert bench.MODES["sync-no-backups"].coordinator == ("--no-speculation",)
    assert bench.MODES["sync-backups"].coordinator == ()


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"


def test_round_and_score_lines_are_read_with_their_times() -> None:
    started = 1_800_000_000.0
    log = "\n".join([
        f"{_stamp(started + 0.5)} coordinator INFO listening on 127.0.0.1:4000",
        f"{_stamp(started + 2.25)} coordinator INFO round 1/3: validation error 0.3140 "
        "(11 units, 0 discarded, 2.01s)",
        f"{_stamp(started + 2.5)} coordinator INFO round 1 scores: inception_score 1.5, "
        "fid_features 212.5, fid_logits 60, n 500",
        f"{_stamp(started + 4.0)} coordinator INFO round 2/3: validation error nan "
        "(12 units, 1 discarded, 1.5s)",
    ])
    rounds = bench.round_rows(log, started)
    assert [(r["round"], r["results"], r["discarded"]) for r in rounds] == [(1, 11, 0),
                                                                           (2, 12, 1)]
    assert rounds[0]["error"] == pytest.approx(0.314)
    assert [r["elapsed"] for r in rounds] == pytest.approx([2.25, 4.0], abs=2e-3)
    scores = bench.score_rows(log, started)
    assert scores == [{"round": 1, "inception_score": 1.5, "fid_features": 212.5,
                       "fid_logits": 60.0, "n": 500.0,
                       "elapsed": pytest.approx(2.5, abs=2e-3)}]


def test_time_to_reach_and_medians_count_unreached_runs_as_last() -> None:
    points = [(1.0, 0.3), (2.0, float("nan")), (3.0, 0.1), (4.0, 0.05)]
    assert bench.time_to_reach(points, 0.10) == 3.0
    assert bench.time_to_reach(points, 0.01) is None
    assert bench.median_or_none([30.0, 10.0, 20.0]) == 20.0
    assert bench.median_or_none([30.0, None, 10.0]) == 30.0
    assert bench.median_or_none([None, 5.0, None]) is None
    assert bench.median_or_none([4.0, 2.0]) == 3.0
    assert bench.median_or_none([]) is None


def test_gan_figures_at_equal_wall_time() -> None:
    rounds = [{"round": i, "results": 2, "elapsed": 5.0 + i} for i in range(1, 11)]
    # rounds 1..5 at 6..10 s: 4 rounds after the first, 8 results of 64 images in 4 s
    assert bench.images_per_second(rounds, 64, 10.0) == pytest.approx(8 * 64 / 4)
    assert bench.images_per_second(rounds[:1], 64, 10.0) is None
    scores = [{"round": 2, "fid_features": 300.0, "elapsed": 7.1},
              {"round": 4, "fid_features": 250.0, "elapsed": 9.2},
              {"round": 6, "fid_features": 200.0, "elapsed": 11.3}]
    assert bench.last_at_or_before(scores, 10.0, "fid_features")["round"] == 4
    assert bench.last_at_or_before(scores, 5.0, "fid_features") is None


def test_letters_table_compares_with_both_sync_modes() -> None:
    summary = {
        "sync-no-backups": {"server_lr": 1.0, "seconds": [60.0, None, 80.0], "median": 80.0,
                            "final_error": 0.07, "results": 330, "discarded": 0},
        "sync-backups": {"server_lr": 1.0, "seconds": [30.0], "median": 30.0,
                         "final_error": 0.065, "results": 330, "discarded": 2},
        "async": {"server_lr": 0.1, "seconds": [20.0], "median": 20.0, "final_error": 0.05,
                  "results": 330, "discarded": 5},
        "buffered-3": {"server_lr": 0.5, "seconds": [None], "median": None,
                       "final_error": 0.2, "results": 360, "discarded": 0},
    }
    for s in summary.values():
        s.update(rounds_to_target=4, seconds_per_round=2.5)
    summary["buffered-3"]["rounds_to_target"] = None
    lines = bench.letters_table(summary, 0.10).splitlines()
    assert len(lines) == 2 + len(summary)
    assert "| sync, no backups | 1 | 60.0, not reached, 80.0 | 80.0 | baseline |" in lines[2]
    assert lines[4] == ("| async | 0.1 | 20.0 | 20.0 | 4.00x sooner | 1.50x sooner | 4 | 2.50 | "
                        "0.0500 | 330 / 5 |")
    assert "| not reached | - | - | not reached | 2.50 |" in lines[5]


def test_summary_takes_medians_over_seeds() -> None:
    def run(mode: str, errors: list[float], step: float) -> dict:
        rounds = [{"round": i + 1, "error": e, "results": 11, "discarded": 0,
                   "elapsed": step * (i + 1)} for i, e in enumerate(errors)]
        return {"mode": mode, "rounds": rounds, "final_error": errors[-1],
                "wall_seconds": step * len(errors) + 1,
                "seconds_to_target": bench.time_to_reach(
                    [(r["elapsed"], r["error"]) for r in rounds], 0.1),
                "cumulative_seconds_to_target": None}
    runs = [run("async", [0.3, 0.09, 0.05], 2.0), run("async", [0.3, 0.2, 0.1], 3.0),
            run("async", [0.3, 0.2, 0.15], 4.0), run("sync-backups", [0.5, 0.4, 0.3], 1.0)]
    summary = bench.summarise(runs, ["sync-backups", "async", "buffered-2"], {"async": 0.1},
                              0.1)
    assert list(summary) == ["sync-backups", "async"]
    assert summary["async"]["seconds"] == [4.0, 9.0, None]
    assert summary["async"]["median"] == 9.0 and summary["async"]["rounds_to_target"] == 3
    assert summary["async"]["seconds_per_round"] == 3.0
    assert summary["async"]["results"] == 99 and summary["async"]["server_lr"] == 0.1
    assert summary["sync-backups"]["median"] is None
    assert summary["sync-backups"]["server_lr"] == 1.0
    assert bench.first_round_at(runs[0]["rounds"], 0.1) == 2
