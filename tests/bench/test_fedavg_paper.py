"""bench/fedavg_paper.py: its arguments, the client's settings of a run, the rounds to a
target and the paper's findings from rows (no process), and its --quick mode through a
coordinator and 2 nodes holding 50 clients each (processes)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "fedavg_paper.py"
_SPEC = importlib.util.spec_from_file_location("bench_fedavg_paper", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up
_SPEC.loader.exec_module(bench)


def test_defaults_run_every_row_on_both_splits_and_quick_a_few() -> None:
    args = bench.parse_args([])
    assert args.runs == [[p, c] for p in ("iid", "shards") for c in bench.CONFIGS]
    assert args.targets == [0.9, 0.93] and args.out == bench.RESULTS
    assert args.fedsgd_rounds > args.rounds >= 100
    quick = bench.parse_args(["--quick"])
    assert quick.runs == [list(pair) for pair in bench.QUICK_RUNS] and quick.out is None
    assert quick.rounds == quick.fedsgd_rounds == 2
    chosen = bench.parse_args(["--configs", "fedsgd,e1-b10", "--partitions", "shards",
                               "--eta", "shards:e1-b10=0.2", "--targets", "0.95,0.9"])
    assert chosen.runs == [["shards", "fedsgd"], ["shards", "e1-b10"]]
    assert chosen.etas[("shards", "e1-b10")] == 0.2 and chosen.targets == [0.9, 0.95]
    for bad in (["--configs", "e2-b10"], ["--partitions", "dirichlet"], ["--targets", "1.5"],
                ["--eta", "iid:fedsgd=-1"], ["--eta", "iid=0.1"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_client_sets_name_the_papers_model_split_and_local_steps() -> None:
    fedsgd = bench.client_sets("shards", "fedsgd", 0.1, 500)
    assert "delta_avg.local_optimizer=gd" in fedsgd and "delta_avg.epochs=1" in fedsgd
    assert "clients.shards_per_client=2" in fedsgd and "clients.partition=shards" in fedsgd
    assert not [item for item in fedsgd if item.startswith("delta_avg.batch_size")]
    fedavg = bench.client_sets("iid", "e5-b10", 0.05, 300)
    assert {"delta_avg.local_optimizer=sgd", "delta_avg.epochs=5", "delta_avg.batch_size=10",
            "delta_avg.eta=0.05", "clients.count=100", "clients.per_round=10",
            "run.rounds=300", "data.format=mnist"} <= set(fedavg)
    model_args = next(item for item in fedavg if item.startswith("run.model_args="))
    assert json.loads(model_args.partition("=")[2]) == {"hidden": [200, 200]}
    assert bench.CONFIGS["e1-b10"].updates_per_round(600) == 60  # the paper's u
    assert bench.CONFIGS["fedsgd"].updates_per_round(80) == 1


def test_rounds_to_target_read_from_metrics_rows() -> None:
    rows = [{"round": 1, "validation_error": 0.5}, {"round": 2, "validation_error": math.nan},
            {"round": 3, "validation_error": 0.08}, {"round": 4, "validation_error": 0.06}]
    accuracies = bench.accuracies_of(rows)
    assert accuracies == pytest.approx([0.5, 0.0, 0.92, 0.94])
    assert bench.rounds_to(accuracies, 0.9) == 3 and bench.rounds_to(accuracies, 0.95) is None
    assert bench.speedup(10, 100, 500) == "10.0x"
    assert bench.speedup(10, None, 500) == ">= 50.0x" and bench.speedup(None, 100, 9) == "-"


def _run(partition: str, config: str, rounds: int | None, budget: int = 100) -> dict:
    return {"partition": partition, "config": config, "rounds_to": {"0.9": rounds},
            "budget": budget, "rounds_run": rounds or budget, "eta": 0.1,
            "best_accuracy": 0.9, "final_accuracy": 0.9, "seconds": 1.0}


def test_findings_and_report_compare_rows_on_the_same_split() -> None:
    args = bench.parse_args(["--configs", "fedsgd,e1-b10", "--targets", "0.9"])
    runs = [_run("iid", "fedsgd", 80), _run("iid", "e1-b10", 8),
            _run("shards", "fedsgd", None), _run("shards", "e1-b10", 40)]
    assert bench.findings(runs, [0.9]) == {"0.9": {"fedavg_fewer_rounds_than_fedsgd": True,
                                                   "non_iid_more_rounds_than_iid": True}}
    text = bench.report(runs, args)
    assert "| FedAvg | 1 | 10 | 8 / 60 | 0.1 / 0.1 | 8 | 10.0x | 92 (16.0x, 2NN) | 40 | " \
           ">= 2.5x | 831 (2.2x, 2NN) |" in text
    assert "| FedSGD | 1 | all | 1 / 1 |" in text and "- (> 100)" in text
    runs[3] = _run("shards", "e1-b10", 5)
    assert not bench.findings(runs, [0.9])["0.9"]["non_iid_more_rounds_than_iid"]


@pytest.mark.processes
@pytest.mark.slow
def test_quick_mode_trains_through_a_coordinator_and_two_nodes(tmp_path: Path) -> None:
    out = tmp_path / "fedavg.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    runs = {(run["partition"], run["config"]): run for run in result["runs"]}
    assert set(runs) == set(bench.QUICK_RUNS)
    for run in runs.values():
        assert 1 <= run["rounds_run"] <= 2 and len(run["accuracy"]) == run["rounds_run"]
        assert run["clients_trained_per_round"] == [10]
        assert run["client_sizes"] == [80, 80]
    assert runs[("iid", "e5-b10")]["labels_per_client"][0] >= 5
    assert runs[("shards", "e5-b10")]["labels_per_client"][1] <= 4  # 2 shards, each <= 2 labels
    assert set(result["findings"]["0.5"]) == {"fedavg_fewer_rounds_than_fedsgd",
                                              "non_iid_more_rounds_than_iid"}
