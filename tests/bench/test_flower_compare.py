"""bench/flower_compare.py: its arguments, the experiment it hands every path, the plain
loop against the project's own FedAvg, and its --quick mode through real processes with
Flower absent (its path skipped with a note, nothing installed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "flower_compare.py"
_SPEC = importlib.util.spec_from_file_location("bench_flower_compare", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_defaults_and_quick() -> None:
    args = bench.parse_args([])
    assert args.rounds == 30 and args.seeds == [1, 2, 3] and args.paths == list(bench.PATHS)
    assert args.json == bench.RESULTS and args.install
    assert (args.clients, args.per_round, args.alpha) == (100, 10, 0.5)
    quick = bench.parse_args(["--quick"])
    assert quick.rounds == 3 and quick.seeds == [1] and quick.paths == list(bench.QUICK_PATHS)
    assert quick.json == bench.QUICK_RESULTS and not quick.install  # never installs
    assert not bench.parse_args(["--no-install"]).install
    for bad in (["--rounds", "1"], ["--seeds", "1,1"], ["--seeds", "x"], ["--paths", "ray"],
                ["--per-round", "0"], ["--lr", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_client_sets_name_the_experiment() -> None:
    sets = bench.client_sets(bench.parse_args(["--rounds", "4"]), 7)
    for pair in ("run.seed=7", "run.rounds=4", "clients.count=100",
                 "clients.partition=dirichlet", "clients.alpha=0.5", "clients.per_round=10",
                 "delta_avg.local_optimizer=sgd", "delta_avg.batch_size=10"):
        assert pair in sets


def test_the_plain_loop_equals_the_project_s_fedavg(tmp_path: Path) -> None:
    """Two rounds of the shared loop (Flower's ClientApp code) give the weights of the
    project's DeltaAveraging on the same clients, replayed in this process."""
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
    from thrift_trainer.training.run_config import load_run_config
    from thrift_trainer.training.units import UnitJob, UnitResult, UnitSpec

    args = bench.parse_args(["--rounds", "2", "--clients", "20", "--per-round", "3"])
    experiment = tmp_path / "experiment.npz"
    facts = bench.write_experiment(args, 5, experiment)
    assert len(facts["sizes"]) == 20 and all(len(r) == 3 for r in facts["sampled"])
    got = bench.flower_app.plain_loop(experiment)
    config = load_run_config(None, bench.client_sets(args, 5)).to_spec().algorithm_config()
    algorithm = DeltaAveraging("mlp_classifier", config, bench.DATA, "letters")
    checked = DeltaAveraging.check_config("mlp_classifier", config)
    weights = algorithm.initial_weights()
    for round_index, clients in enumerate(facts["sampled"], start=1):
        results = []
        for client in clients:
            unit = UnitSpec(unit_id=f"client{client}", unit_path="", client=f"client{client}")
            job = UnitJob("replay", round_index, unit, "mlp_classifier", config,
                          {k: v.copy() for k, v in weights.items()}, dataset="letters",
                          checked_config=checked)
            output = DeltaAveraging.run_unit(job, bench.DATA)
            results.append(UnitResult(unit, output.update, output.num_samples, output.loss))
        weights = algorithm.aggregate(round_index, weights, results, [])
    for name, value in got["final_weights"].items():
        np.testing.assert_allclose(np.asarray(value), weights[name], rtol=1e-4, atol=1e-5)


def test_summary_and_rotation() -> None:
    def run(path: str, seed: int, step: float) -> dict:
        rows = [{"round": r, "validation_error": 0.5 - 0.1 * r, "seconds": 9.0 if r == 1
                 else step, "phases": {"units": step / 2}, "unit_seconds": [step / 4] * 2}
                for r in (1, 2, 3)]
        return {"path": path, "seed": seed, "rounds": rows, "wall_seconds": 10.0}
    runs = [run("ours-halves", 1, 0.2), run("ours-halves", 2, 0.4), run("flower", 1, 1.0),
            run("plain", 1, 0.1), {"path": "flower", "seed": 2, "error": "boom"}]
    summary = bench.summarise(runs, list(bench.PATHS))
    assert list(summary) == ["ours-halves", "flower", "plain"]
    assert summary["ours-halves"]["seconds_per_round"] == pytest.approx(0.3)
    assert summary["ours-halves"]["phases_median"]["units"] == pytest.approx(0.15)
    assert summary["plain"]["accuracy"] == pytest.approx([0.6, 0.7, 0.8])
    assert summary["ours-halves"]["unit_seconds_sum_median"] == pytest.approx(0.15)
    assert bench.ratios(summary) == {
        "ours-halves / flower": pytest.approx(0.3),
        "ours-halves / flower, paired": pytest.approx(0.2),  # seed 1 only
        "ours-halves / plain": pytest.approx(3.0),
        "ours-halves / plain, paired": pytest.approx(2.0)}
    assert bench.order_of(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert bench.order_of(["a", "b", "c"], 3) == ["a", "b", "c"]


@pytest.mark.processes
@pytest.mark.slow
def test_quick_runs_without_flower(tmp_path: Path, capsys) -> None:
    out = tmp_path / "quick.json"
    code = bench.main(["--quick", "--rounds", "2", "--flower-venv", str(tmp_path / "none"),
                       "--json", str(out)])
    assert code == 0, capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["flower_versions"] is None
    assert any(note.startswith("Flower side skipped") for note in result["notes"])
    assert not (tmp_path / "none").exists()  # nothing was installed
    assert set(result["summary"]) == {"ours-halves", "plain"}
    ours = next(r for r in result["runs"] if r["path"] == "ours-halves")
    plain = next(r for r in result["runs"] if r["path"] == "plain")
    assert ours["same_clients"] and ours["dropped_or_failed"] == 0
    assert ours["max_weight_difference"] < 1e-4
    for a, b in zip(ours["rounds"], plain["rounds"], strict=True):
        assert a["validation_error"] == pytest.approx(b["validation_error"], abs=2e-3)
    assert "Flower side skipped" in capsys.readouterr().out
