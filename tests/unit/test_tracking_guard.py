"""A tracker's trouble is never the run's (coordinator/tracking.py): the first error of a
tracker stops it for the run, the others go on; figures and settings as trackers take them."""

from __future__ import annotations

import logging
import sys

import pytest

from thrift_trainer.coordinator.tracking import (
    KINDS,
    LIBRARIES,
    Trackers,
    figures_of,
    flat_params,
    load_libraries,
)


class Recording:
    def __init__(self, fail_at: str = "") -> None:
        self.fail_at = fail_at
        self.calls: list[tuple] = []

    def _record(self, name: str, *args) -> None:
        if name == self.fail_at:
            raise OSError(f"{name} failed: disk full")
        self.calls.append((name, *args))

    def start(self, run_id, description):
        self._record("start", run_id)

    def log_round(self, round_index, figures):
        self._record("log_round", round_index, dict(figures))

    def finish(self, state, files):
        self._record("finish", state)


def test_a_failing_tracker_stops_alone_and_is_logged_once(caplog):
    good, bad = Recording(), Recording(fail_at="log_round")
    made = {"good": good, "bad": bad}
    trackers = Trackers(["good", "bad"], make=made.__getitem__)
    with caplog.at_level(logging.WARNING, logger="coordinator.tracking"):
        trackers.start("r1", {"run_id": "r1"})
        trackers.log_round(1, {"round": 1, "validation_error": 0.5, "discarded": []})
        trackers.log_round(2, {"round": 2, "validation_error": 0.4})
        trackers.finish("completed")
        trackers.finish("failed")  # a run ends its trackers once
    assert good.calls == [("start", "r1"), ("log_round", 1, {"validation_error": 0.5}),
                          ("log_round", 2, {"validation_error": 0.4}), ("finish", "completed")]
    assert bad.calls == [("start", "r1")]
    assert caplog.text.count("tracking to bad stopped for this run: log_round failed") == 1


def test_a_tracker_that_cannot_be_made_leaves_the_others():
    good = Recording()

    def make(target):
        if target == "broken":
            raise ImportError("no module named tensorboard")
        return good

    trackers = Trackers(["broken", "good"], make=make)
    trackers.start("r1", {})
    trackers.finish("cancelled")
    assert good.calls == [("start", "r1"), ("finish", "cancelled")]


def test_figures_are_the_measured_numbers_of_a_row_with_phases_nested():
    row = {"round": 3, "validation_error": 0.25, "fid": float("nan"), "ok": True,
           "discarded": ["u1"], "phase_seconds": {"units": 1.5, "evaluate": 0.25}}
    assert figures_of(row) == {"validation_error": 0.25, "phase_seconds/units": 1.5,
                               "phase_seconds/evaluate": 0.25}


def test_settings_become_flat_parameters_cut_to_a_length():
    params = flat_params({"eta": 0.01, "hidden": [20], "aggregation": {"rule": "mean"},
                          "name": "x" * 900, "empty": {}})
    assert params["eta"] == "0.01" and params["hidden"] == "[20]"
    assert params["aggregation.rule"] == "mean" and params["empty"] == "{}"
    assert len(params["name"]) == 500


@pytest.mark.parametrize("target", ["wandb:x", "mlflow", "tensorboard:"])
def test_an_unknown_or_incomplete_target_is_refused(target):
    from thrift_trainer.coordinator.tracking import check_target

    with pytest.raises(ValueError, match="expected tensorboard:DIR or mlflow:URI"):
        check_target(target)


def test_every_kind_names_the_libraries_it_writes_with_and_they_load_before_a_run():
    assert set(LIBRARIES) == set(KINDS)
    load_libraries(["tensorboard:/nowhere"])  # torch's writer: installed with torch
    assert "torch.utils.tensorboard" in sys.modules
