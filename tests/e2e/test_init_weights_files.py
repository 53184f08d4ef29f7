"""`run.init_weights` through real processes: a coordinator reads starting weights only
from the folders it allows (its data root, its run folders, --weights-dir), refuses any
other path with one answer whether it exists or not, and refuses a weights file whose
array header claims more than the file holds in one line naming it, with its memory flat,
then serves the next run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Cluster
from tests.hostile import lie_about_size, peak_bytes
from thrift_trainer.training.models.modules import mlp_classifier
from thrift_trainer.training.outputs.model_file import save_model

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

MIB = 1024 * 1024
PEAK_GROWTH_LIMIT = 256 * MIB
LETTERS_CLASSIFIER = ["--set", "run.model=mlp_classifier", "--set", "run.dataset=letters",
                      "--set", "data.format=letters", "--set", "run.algorithm=delta_avg",
                      "--set", "run.rounds=1", "--set", "delta_avg.epochs=1"]


def _weights_file(path: Path) -> Path:
    """Starting weights of the letters classifier (16 features, 26 classes), as an .npz."""
    state = mlp_classifier(16, 26).state_dict()
    return save_model(path, {name: value.numpy() for name, value in state.items()},
                      {"model": "mlp_classifier"})


def _start(cluster: Cluster, allowed: Path | None = None) -> None:
    """A node and a coordinator; ``allowed``: its --weights-dir (none: the defaults)."""
    cluster.add_node(0.0)
    if allowed is None:
        cluster.start_coordinator(2)
        return
    allowed.mkdir(exist_ok=True)
    cluster.start_coordinator(2, "--weights-dir", str(allowed))


def _refusal(cluster: Cluster, path: Path | str):
    """The one line a run from ``path`` is refused with (exit 2, no traceback)."""
    done = cluster.client(*LETTERS_CLASSIFIER, "--set", f"run.init_weights={path}")
    assert done.returncode == 2, done.stdout + done.stderr + cluster.logs()
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    return done.stderr.strip()


def _run_folders(cluster: Cluster) -> list[Path]:
    runs = cluster.workdir / "runs"
    return [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []


def test_paths_outside_the_allowed_folders_get_one_answer_and_train_nothing(cluster):
    _start(cluster)  # allowed: the data root and the run folders
    outside = cluster.workdir / "outside"
    existing = _weights_file(outside / "weights.npz")
    link = cluster.workdir / "runs" / "link.npz"  # in the run folders, to a file outside
    link.symlink_to(existing)
    paths = {"existing": existing, "missing": outside / "missing.npz",
             "under a file": existing / "x.npz", "a link out": link}
    answers = {case: _refusal(cluster, path).replace(str(path), "PATH")
               for case, path in paths.items()}
    assert len(set(answers.values())) == 1, answers
    assert "not in a folder this coordinator allows" in answers["existing"], answers
    assert "--weights-dir" in answers["existing"], answers
    assert _run_folders(cluster) == []  # refused before any run existed


def test_a_file_in_a_weights_dir_starts_the_run(cluster):
    allowed = cluster.workdir / "allowed"
    _start(cluster, allowed)
    missing = _refusal(cluster, allowed / "missing.npz")
    assert "not found" in missing, missing  # inside an allowed folder it may say so
    weights = _weights_file(allowed / "weights.npz")
    result = cluster.train_json(*LETTERS_CLASSIFIER, "--set", f"run.init_weights={weights}")
    assert len(result["history"]) == 1, result


def test_a_lying_array_header_is_refused_in_one_line_and_the_next_run_trains(cluster):
    _start(cluster)
    runs = cluster.workdir / "runs"  # the run folders: allowed by default
    lying = _weights_file(runs / "lying.npz")
    lie_about_size(lying, "1.weight")
    assert lying.stat().st_size < 16 * 1024  # claiming 8 TiB
    good = _weights_file(runs / "good.npz")
    # a run first: torch and the model are loaded, so the peak grows only by what the lie
    # could make the coordinator allocate
    cluster.train_json(*LETTERS_CLASSIFIER, "--set", f"run.init_weights={good}")
    peak = peak_bytes(cluster.coordinator)
    line = _refusal(cluster, lying)
    assert str(lying) in line and "Internal error" not in line, line
    assert peak_bytes(cluster.coordinator) - peak < PEAK_GROWTH_LIMIT
    result = cluster.train_json(*LETTERS_CLASSIFIER, "--set", f"run.init_weights={good}")
    assert np.isfinite(result["history"][-1]["validation_error"]), result
