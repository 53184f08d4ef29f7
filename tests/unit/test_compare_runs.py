"""Comparing finished runs (client/compare.py) and planning a sweep (client/sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrift_trainer.client import sweep
from thrift_trainer.client.compare import (
    CompareError,
    compare,
    label_runs,
    load_run,
    save_record,
    table_lines,
)
from thrift_trainer.client.errors import ClientError
from thrift_trainer.wire.generated import ttypes


def run_folder(root: Path, run_id: str, errors: list[float], eta: float = 0.1,
               seed: int = 1) -> Path:
    folder = root / run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "run_id": run_id, "algorithm": "delta_avg", "model": "mlp", "dataset": "letters",
        "config": {"eta": eta, "seed": seed, "aggregation": {"rule": "mean"}}}))
    rows = [{"round": i, "validation_error": e, "validation_loss": e * 2,
             "train_loss": e * 3, "seconds": 1.5, "bytes_down": 2**20, "bytes_up": 2**19}
            for i, e in enumerate(errors, 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def record(root: Path, run_id: str, errors: list[float], eta: float, seed: int) -> Path:
    request = ttypes.TrainRequest(run_id=run_id, algorithm="delta_avg", model="mlp",
                                  dataset="letters", rounds=len(errors),
                                  config_json=json.dumps({"eta": eta, "seed": seed}))
    result = {"run_id": run_id, "validation_error": errors[-1], "wall_seconds": 3.0,
              "history": [{"round": i, "validation_error": e, "validation_loss": e,
                           "train_loss": e, "seconds": 1.0} for i, e in enumerate(errors, 1)]}
    return save_record(root / f"{run_id}.json", request, result)


def test_seeds_of_one_setting_give_its_mean_and_spread(tmp_path):
    runs = [run_folder(tmp_path, "a1", [0.5, 0.3, 0.4], eta=0.1, seed=1),
            run_folder(tmp_path, "a2", [0.5, 0.2, 0.2], eta=0.1, seed=2),
            run_folder(tmp_path, "b1", [0.6, 0.5, 0.45], eta=0.01, seed=1)]
    compared = compare(runs, tmp_path / "out" / "cmp.png", title="eta")
    settings = {row["setting"]: row for row in compared["settings"]}
    assert set(settings) == {"eta=0.1", "eta=0.01"}  # only what differs, seed left out
    fast = settings["eta=0.1"]
    assert fast["runs"] == ["a1", "a2"] and fast["seeds"] == [1, 2]
    assert fast["final"] == pytest.approx(0.3) and fast["final_std"] == pytest.approx(0.1414, 1e-3)
    assert fast["best"] == pytest.approx(0.25) and fast["best_round"] == pytest.approx(2.0)
    assert fast["train_loss"] == pytest.approx(0.9)
    assert fast["seconds"] == pytest.approx(4.5) and fast["mib"] == pytest.approx(4.5)
    assert settings["eta=0.01"]["final_std"] == 0.0
    picture = Path(compared["picture"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = table_lines(compared["settings"])
    assert lines[1].startswith("eta=0.1 ") and "0.3000 ± 0.1414" in lines[1]  # best first
    assert "0.2500 ± 0.0707 (2)" in lines[1]


def test_client_records_and_run_ids_are_found_and_compared(tmp_path, monkeypatch):
    models = tmp_path / "models"
    record(models, "r-s1", [0.4, 0.3], eta=0.1, seed=1)
    record(models, "r-s2", [0.4, 0.1], eta=0.1, seed=2)
    run = load_run("r-s2", search=[models])
    assert run.rows[-1]["validation_error"] == 0.1 and run.seed == 2
    assert run.cumulative("bytes") is None  # a record has no per-round bytes
    compared = compare(["r-s1", "r-s2"], None, search=[models])
    assert compared["picture"] is None
    (only,) = compared["settings"]
    assert only["final"] == pytest.approx(0.2) and only["mib"] is None


def test_a_run_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(CompareError, match="no such run folder or record"):
        load_run("missing", search=[tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="not a run folder"):
        load_run(tmp_path / "empty")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CompareError, match="cannot be read"):
        load_run(tmp_path / "bad.json")
    run_folder(tmp_path, "none", [])
    with pytest.raises(CompareError, match="no finished round"):
        load_run(tmp_path / "none")


def test_labels_name_what_sets_runs_apart(tmp_path):
    a = load_run(run_folder(tmp_path, "a", [0.5], eta=0.1))
    b = load_run(run_folder(tmp_path, "b", [0.5], eta=0.1, seed=9))
    label_runs([a, b])
    assert a.label == b.label == "delta_avg"  # seeds of the one setting


# ------------------------------------------------------------------------- sweeps
def test_grid_values_split_outside_brackets():
    assert sweep.split_values("[64,64],[128], 0.1") == ["[64,64]", "[128]", "0.1"]
    assert sweep.parse_grid(["delta_avg.eta=0.01,0.1"]) == [("delta_avg.eta", ["0.01", "0.1"])]
    for bad in ("eta=0.1", "delta_avg.eta", "delta_avg.eta=0.1,,0.2"):
        with pytest.raises(ValueError, match="--grid"):
            sweep.parse_grid([bad])


def test_every_combination_and_seed_is_planned_and_checked_before_any_runs():
    built = []

    def build(sets, run_id):
        built.append((run_id, sets))
        return ttypes.TrainRequest(run_id=run_id)

    planned = sweep.plan("sw", [("a.x", ["1", "2"]), ("a.y", ["p", "q"])], [1, 2],
                         ["run.rounds=2"], build)
    assert [p.run_id for p in planned][:3] == ["sw-01-s1", "sw-01-s2", "sw-02-s1"]
    assert len(planned) == len(built) == 8
    assert built[0][1] == ["run.rounds=2", "a.x=1", "a.y=p", "run.seed=1"]
    with pytest.raises(ValueError, match="at most 1000"):
        sweep.plan("sw", [("a.x", [str(i) for i in range(1001)])], None, [], build)


def test_a_failed_run_is_reported_and_the_sweep_goes_on(tmp_path, capsys):
    planned = sweep.plan("sw", [("delta_avg.eta", ["0.1", "0.01"])], None, [],
                         lambda sets, run_id: ttypes.TrainRequest(
                             run_id=run_id, algorithm="delta_avg", model="mlp",
                             dataset="letters", rounds=1, config_json=json.dumps(
                                 {"eta": float(sets[0].split("=")[1]), "seed": 1})))

    def train(run):
        if run.run_id == "sw-01":
            raise ClientError("the coordinator refused it")
        return {"run_id": run.run_id, "validation_error": 0.25, "wall_seconds": 1.0,
                "history": [{"round": 1, "validation_error": 0.25, "train_loss": 1.0,
                             "seconds": 1.0}]}

    records, failures = sweep.run_all(planned, tmp_path, train, lambda line: None)
    assert [r.name for r in records] == ["sw-02.json"]
    assert failures == ["sw-01: the coordinator refused it"]
    assert sweep.finish(records, failures, tmp_path, "sw", as_json=False) == 1
    out = capsys.readouterr().out
    assert "failed: sw-01" in out and (tmp_path / "compare.png").is_file()
    assert json.loads((tmp_path / "compare.json").read_text())["failed"] == failures
