"""bench/secure_aggregation.py: its arguments, the runs it makes, the Flower settings it
maps from ours, its in-process round of the primitives, and its --quick mode through a
coordinator and 2 nodes (processes): the secure runs trained the plain run's clients, and
their rounds record the secure steps' phases."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "secure_aggregation.py"
_SPEC = importlib.util.spec_from_file_location("bench_secure_aggregation", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_defaults_and_quick() -> None:
    args = bench.parse_args([])
    assert args.per_round == [10, 100] and args.count == 200 and args.rounds == 6
    assert args.sizes == [100_000, 1_000_000] and args.flower and args.out == bench.RESULTS
    quick = bench.parse_args(["--quick"])
    assert quick.per_round == [10] and quick.rounds == 3 and quick.count == 40
    assert not quick.flower and quick.out is None
    for bad in (["--rounds", "1"], ["--per-round", "2"], ["--per-round", "300"],
                ["--sizes", "x"], ["--per-round", "10,10"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_runs_and_flower_mapping() -> None:
    names = [name for name, _ in bench.variants(100)]
    assert names == ["plain", "secure-complete", "secure-k10"]
    assert bench.variants(10)[2][1][-1] == "secure_aggregation.neighbours=4"
    assert bench.variants(100)[0][1] == []
    complete = bench.flower_settings(100, 0, 4)
    assert complete["secure"] and complete["num_shares"] == 1.0
    assert complete["modulus_range"] == 2 ** 32
    # the largest power of 2 whose 100-fold sum fits the modulus
    assert complete["quantization_range"] == 2 ** 25
    assert 100 * complete["quantization_range"] <= 2 ** 32 < 200 * complete["quantization_range"]
    assert bench.flower_settings(100, 10, 4)["num_shares"] == 11  # its own share counted
    assert not bench.flower_settings(10, None, 4)["secure"]
    assert bench.flower_settings(10, 4, 4)["quantization_range"] == 2 ** 28


def test_the_in_process_round_times_every_step() -> None:
    row = bench.primitives(6, 2, [1000, 2000], timed_clients=2)
    assert row["degree"] == 2 and row["clients"] == 6
    assert set(row["sizes"]) == {"1000", "2000"}
    for key in ("client_keys_seconds", "client_shares_seconds", "client_unmask_seconds"):
        assert row[key] > 0
    for figures in row["sizes"].values():
        assert figures["client_mask_seconds"] > 0 and figures["coordinator_unmask_seconds"] > 0


@pytest.mark.processes
@pytest.mark.slow
def test_quick_mode_compares_the_same_clients(tmp_path: Path) -> None:
    out = tmp_path / "secure.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["flower"] == {} and result["bits"] == 32
    assert any("Flower side not run" in note for note in result["notes"])
    (size,) = result["rounds"]
    assert size["per_round"] == 10
    runs = size["runs"]
    assert list(runs) == ["plain", "secure-complete", "secure-k4"]
    for name, run in runs.items():
        assert run["same_clients_as_plain"], name
        assert run["clients_trained"] == [10, 10, 10]
        assert run["parameters"] == 2778
        assert run["round_seconds_median"] > 0 and run["bytes_per_parameter_client"] > 0
        secure = set(bench.SECURE_PHASES) <= set(run["phase_seconds_median"])
        assert secure == (name != "plain"), (name, run["phase_seconds_median"])
    assert runs["plain"]["ratio_bytes"] == 1.0
    # a masked update weighs what a float32 one does; the three extra steps come on top
    assert runs["secure-complete"]["bytes_up_per_parameter_client"] > \
        runs["plain"]["bytes_up_per_parameter_client"]
    # the key, share and unmask steps carry no weights and leave the nodes' copy of the
    # round's weights referable: the model is not sent again with each training unit
    model_bytes = 4 * runs["plain"]["parameters"]
    for name in ("secure-complete", "secure-k4"):
        extra = runs[name]["bytes_down_median"] - runs["plain"]["bytes_down_median"]
        assert 0 < extra < 10 * model_bytes, (name, extra)
    assert [case["degree"] for case in result["in_process"]] == [9, 4]
    assert all(set(case["sizes"]) == {"10000"} for case in result["in_process"])
