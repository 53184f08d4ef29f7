"""The dashboard's comparison view (dashboard/comparison.py): the runs named in the page's
address, read from their folders as `client.py compare` reads them."""

from __future__ import annotations

import pytest

from tests.unit.test_compare_runs import run_folder
from thrift_trainer.dashboard.comparison import (
    MAX_COMPARED,
    ComparisonError,
    comparison,
    parse_run_ids,
)


def test_runs_of_one_setting_are_summed_up_and_every_run_keeps_its_curves(tmp_path):
    run_folder(tmp_path, "a1", [0.5, 0.3], eta=0.1, seed=1)
    run_folder(tmp_path, "a2", [0.5, 0.1], eta=0.1, seed=2)
    run_folder(tmp_path, "b1", [0.6, 0.4, 0.45], eta=0.01, seed=1)
    view = comparison(tmp_path, ["a1", "a2", "b1"])
    rows = {row["setting"]: row for row in view["settings"]}
    assert set(rows) == {"eta=0.1", "eta=0.01"}
    assert rows["eta=0.1"]["final"] == pytest.approx(0.2)
    assert rows["eta=0.1"]["final_std"] == pytest.approx(0.1414, abs=1e-4)
    assert rows["eta=0.01"]["best"] == 0.4 and rows["eta=0.01"]["best_round"] == 2
    b1 = next(run for run in view["runs"] if run["run_id"] == "b1")
    assert b1["round"] == [1, 2, 3] and b1["validation_error"] == [0.6, 0.4, 0.45]
    assert b1["seconds"] == [1.5, 3.0, 4.5]  # summed up to each round
    assert b1["mib"] == [1.5, 3.0, 4.5]  # 1 MiB down and 0.5 MiB up each round
    assert (b1["label"], b1["seed"]) == ("eta=0.01", 1)


@pytest.mark.parametrize(("text", "why"), [
    ("", "name the runs to compare"), (" , ", "name the runs to compare"),
    (",".join(f"r{i}" for i in range(MAX_COMPARED + 1)), f"at most {MAX_COMPARED} runs"),
    ("ok,../etc", "not a run id: '../etc'")])
def test_the_address_names_a_bounded_list_of_valid_run_ids(text, why):
    with pytest.raises(ComparisonError, match=why):
        parse_run_ids(text)


def test_duplicates_are_compared_once():
    assert parse_run_ids("a, b,a") == ["a", "b"]


def test_a_run_without_a_folder_is_named_without_the_coordinators_paths(tmp_path):
    run_folder(tmp_path, "a1", [0.5])
    with pytest.raises(ComparisonError) as refused:
        comparison(tmp_path, ["a1", "gone"])
    assert str(refused.value).startswith("gone: no such run folder")
    assert str(tmp_path) not in str(refused.value)
