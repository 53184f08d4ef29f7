"""bench/gan_iteration_cost.py: the bound an iteration is held to, and how a run's
phases and unit times are summarised (no process started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gan_iteration_cost as cost  # noqa: E402


def test_units_share_the_cores_and_a_core_per_node_costs_one_unit() -> None:
    assert cost.bound_ms(10.0, workers=5, cores=2) == 25.0
    assert cost.bound_ms(10.0, workers=2, cores=16) == 10.0


def test_summary_leaves_out_warm_up_and_the_scored_last_round() -> None:
    phases = [{"plan": 0.5, "units": 5.0, "after_round": 0.0, "score": 0.0}]  # warm-up
    phases += [{"plan": 0.01, "units": 0.05 + r / 1000, "after_round": 0.0, "score": 0.0}
               for r in range(2, 6)]
    phases[3]["after_round"] = 0.04  # a swap in round 4
    phases.append({"plan": 0.01, "units": 0.05, "after_round": 0.0, "score": 0.3})
    starts = {r: 10.0 + 0.1 * r for r in range(1, 7)}
    attempts = [[r, starts[r] + 0.001 * i, starts[r] + 0.02 + 0.001 * i]
                for r in range(1, 7) for i in range(2)]
    summary = cost.summarise({"phase_seconds": phases, "attempts": attempts, "rounds": 6,
                              "seconds": 2.0}, skip_first=1)
    assert summary["rounds_kept"] == 4  # rounds 2-5
    assert summary["phases_ms"]["plan"] == pytest.approx(10.0)
    assert summary["phases_ms"]["units"] == pytest.approx(53.5)  # median of 52..55
    assert summary["phases_ms"]["after_round"] == pytest.approx(10.0)  # 40 ms / 4 rounds
    assert summary["round_wall_ms"] == pytest.approx(100.0)
    assert summary["unit_trip_ms"] == pytest.approx(20.0)
    assert summary["score_ms"] == pytest.approx(300.0)
