"""bench/privacy_costs.py: its arguments, the client's settings and the search for the noise
multiplier (no process), and its --quick mode through a coordinator and 2 nodes holding
half of 1,000 clients each, against the same DP-FedAvg in one process (processes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from thrift_trainer.training.privacy.accounting import Sampling

_PATH = Path(__file__).resolve().parents[2] / "bench" / "privacy_costs.py"
_SPEC = importlib.util.spec_from_file_location("bench_privacy_costs", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_defaults_and_quick() -> None:
    args = bench.parse_args([])
    assert args.targets == [1.0, 3.0, 8.0] and args.out == bench.RESULTS
    assert args.rounds == bench.DEFAULTS["rounds"]
    assert args.per_round == bench.DEFAULTS["per_round"] == 100
    quick = bench.parse_args(["--quick"])
    assert quick.targets == [8.0] and quick.rounds == 3 and quick.per_round == 20
    assert quick.out is None
    for bad in (["--targets", "0"], ["--targets", "x"], ["--per-round", "1000"],
                ["--clip", "0"], ["--rounds", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_client_sets_carry_privacy_only_for_a_target() -> None:
    args = bench.parse_args(["--quick"])
    private = bench.client_sets(args, bench.Setting(3.0, 1.25))
    assert {"clients.count=1000", "clients.sampling=poisson", "clients.per_round=20",
            "privacy.noise_multiplier=1.25", "privacy.delta=0.0001",
            "outputs.checkpoint_every=1", "run.rounds=3", *bench.PARTITION} <= set(private)
    plain = bench.client_sets(args, bench.Setting(None, 0.0))
    assert not [item for item in plain if item.startswith("privacy.")]
    assert set(plain) < set(private)


def test_the_noise_found_spends_the_target_and_no_less_noise_would() -> None:
    sampling = Sampling("poisson", 1000, 50)
    z = bench.noise_for(3.0, sampling, 60)
    assert bench.project_epsilon(z, sampling, 60) <= 3.0
    assert bench.project_epsilon(z * (1 - 1e-3), sampling, 60) > 3.0
    direct = bench.dp_accounting_epsilons(z, sampling.q, 60)
    assert direct["rdp"] == pytest.approx(bench.project_epsilon(z, sampling, 60), rel=1e-9)
    assert direct["pld"] < direct["rdp"]  # PLD accounting is the tighter bound


def test_opacus_is_skipped_without_its_venv(tmp_path: Path) -> None:
    assert bench.opacus_epsilons(tmp_path / "none", [{"z": 1.0, "q": 0.1, "rounds": 1,
                                                       "delta": 1e-4}]) is None


@pytest.mark.processes
@pytest.mark.slow
def test_quick_mode_runs_equal_their_one_process_replay(tmp_path: Path) -> None:
    out = tmp_path / "privacy.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {row["setting"]: row for row in result["runs"]}
    assert set(rows) == {"epsilon 8", "non-private"}
    for row in rows.values():
        assert row["rounds"] == 3 and row["clients_holding_data"] == 1000
        assert row["same_clients_as_the_draw"], row
        assert sum(row["clients_per_round"]) > 0
        assert row["max_abs_weight_difference"] <= result["weight_tolerance"], row
        assert row["one_process_accuracy"] == pytest.approx(row["accuracy"], abs=1e-3)
        assert 0 < row["accuracy"] <= 1 and row["wall_seconds"] > 0
    assert rows["non-private"]["epsilon"] is None
    private = rows["epsilon 8"]
    assert private["noise_multiplier"] > 0 and private["epsilon"] <= 8.0
    assert private["epsilons"] == sorted(private["epsilons"])  # spent grows each round
    (case,) = result["epsilon_checks"]["cases"]
    assert case["run_epsilon"] == pytest.approx(case["rdp"], rel=5e-4)  # 3 digits
    assert case["rdp"] == pytest.approx(8.0, rel=1e-3)
    assert case["pld"] < case["rdp"]
    if case["opacus_rdp"] is None:
        assert "not run" in result["epsilon_checks"]["opacus"]
    else:  # another RDP implementation, other orders: close, not equal
        assert case["opacus_rdp"] == pytest.approx(case["rdp"], rel=0.05)
