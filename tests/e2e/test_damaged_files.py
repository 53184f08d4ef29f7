"""Damaged model, checkpoint and run files: one line naming the file, exit 1, no traceback."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from devtools.local_cluster import REPO, python_env
from tests.hostile import lie_about_size
from thrift_trainer.coordinator.checkpoint import Checkpoint, save_checkpoint
from thrift_trainer.training.models import mlp
from thrift_trainer.training.outputs.model_file import save_model

SPEC = mlp.MLPSpec(hidden=(20,))
RUN_ID = "damaged"


def _script(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd,
                          env=python_env(), capture_output=True, text=True, timeout=120)


def _good_model(path: Path) -> Path:
    return save_model(path, mlp.init_params(SPEC), {"model": "mlp",
                                                     "spec": dataclasses.asdict(SPEC)})


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(7).bytes(4096))


def _plain_arrays(path: Path) -> None:  # an .npz, but not one of this trainer's
    with open(path, "wb") as f:
        np.savez(f, x=np.zeros(3))


def _other_model(path: Path) -> None:  # a model of another shape than its description says
    spec = dataclasses.asdict(SPEC)
    save_model(path, mlp.init_params(mlp.MLPSpec(hidden=(5,))), {"model": "mlp", "spec": spec})


def _damaged_description(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, W=np.zeros((17, 20)), __model__=np.array("{not json"))


def _no_spec(path: Path) -> None:
    save_model(path, mlp.init_params(SPEC), {"model": "mlp"})


MODEL_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate, "random bytes": _random_bytes, "plain arrays": _plain_arrays,
    "other shape": _other_model, "damaged description": _damaged_description,
    "no spec": _no_spec, "empty": lambda p: p.write_bytes(b""),
}


def _assert_one_line_error(done: subprocess.CompletedProcess, names: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert names in errors[0], done.stderr


@pytest.mark.parametrize("damage", MODEL_DAMAGE, ids=list(MODEL_DAMAGE))
@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_damaged_model_file_is_one_line_and_exit_1(tmp_path, command, damage):
    model = _good_model(tmp_path / "model.npz")
    MODEL_DAMAGE[damage](model)
    rows = tmp_path / "rows.csv"
    rows.write_text("2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8,19\n")
    args = [str(model), str(rows)] if command == "predict" else [str(model), "--data", str(rows)]
    done = _script("client.py", command, *args, cwd=tmp_path)
    _assert_one_line_error(done, str(model))
    assert done.stderr.count("\n") == 1, done.stderr  # the client logs nothing else


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_a_lying_array_header_is_one_line_and_exit_1(tmp_path, command):
    """A 1 KiB model whose array header claims 2^40 float64 (8 TiB) is refused before
    anything is allocated for it."""
    model = _good_model(tmp_path / "model.npz")
    lie_about_size(model, "W")
    rows = tmp_path / "rows.csv"
    rows.write_text("2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8,19\n")
    args = {"evaluate": [str(model), "--data", str(rows)], "predict": [str(model), str(rows)],
            "export": [str(model)]}[command]
    done = _script("client.py", command, *args, cwd=tmp_path)
    _assert_one_line_error(done, str(model))
    assert done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "model.safetensors").exists()


def _run_dir(tmp_path: Path) -> Path:
    """A run of the letters MLP with a checkpoint after round 1 of 3."""
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    request = {"run_id": RUN_ID, "algorithm": "delta_avg", "model": "mlp",
               "dataset": "letters", "rounds": 3,
               "config_json": json.dumps({"epochs": 1, "eta": 0.01, "hidden": [20]}),
               "outputs_json": None}
    (run_dir / "request.json").write_text(json.dumps(request))
    optimizer = {"name": np.array("avg"), "step": np.array(1)}  # delta_avg's default
    checkpoint = Checkpoint(1, mlp.init_params(SPEC), optimizer, None)
    save_checkpoint(run_dir, checkpoint, {"model": "mlp", "spec": dataclasses.asdict(SPEC)})
    return run_dir


def test_a_sound_checkpoint_is_evaluated_like_a_model(tmp_path):
    checkpoint = _run_dir(tmp_path) / "checkpoint.npz"
    rows = tmp_path / "rows.csv"
    rows.write_text("2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8,19\n")
    done = _script("client.py", "evaluate", str(checkpoint), "--data", str(rows), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rows 1" in done.stdout


def _model_instead_of_checkpoint(run_dir: Path) -> None:
    _good_model(run_dir / "checkpoint.npz")


def _checkpoint_of_another_model(run_dir: Path) -> None:
    save_checkpoint(run_dir, Checkpoint(1, mlp.init_params(mlp.MLPSpec(hidden=(5,))), {}, None),
                    {"model": "mlp"})


def _bad_random_state(run_dir: Path) -> None:
    save_model(run_dir / "checkpoint.npz", mlp.init_params(SPEC),
               {"round": 1, "policy_rng": [3, [1, 2], None]})


def _damaged_request(run_dir: Path) -> None:
    (run_dir / "request.json").write_text('{"run_id": "damaged", "rounds": "three"')


def _wrong_request_types(run_dir: Path) -> None:
    request = json.loads((run_dir / "request.json").read_text())
    (run_dir / "request.json").write_text(json.dumps({**request, "rounds": "three"}))


def _damaged_metrics(run_dir: Path) -> None:
    (run_dir / "metrics.jsonl").write_text('{"round": 1, "validation_error": 0.5}\n{"rou')


RUN_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (lambda d: _truncate(d / "checkpoint.npz"), "checkpoint.npz"),
    "random bytes": (lambda d: _random_bytes(d / "checkpoint.npz"), "checkpoint.npz"),
    "a model file": (_model_instead_of_checkpoint, "checkpoint.npz"),
    "another model": (_checkpoint_of_another_model, "checkpoint.npz"),
    "bad random state": (_bad_random_state, "checkpoint.npz"),
    "damaged request": (_damaged_request, "request.json"),
    "request field types": (_wrong_request_types, "request.json"),
    "damaged metrics": (_damaged_metrics, "metrics.jsonl"),
    "lying array header": (lambda d: lie_about_size(d / "checkpoint.npz", "W"),
                           "checkpoint.npz"),
}


def _resume(tmp_path: Path) -> subprocess.CompletedProcess:
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("127.0.0.1,9\n")  # never called: the resume fails before any round
    return _script("coordinator_node.py", "0", "2", "--nodes-file", str(nodes),
                   "--run-dir", str(tmp_path / "runs"), "--resume", RUN_ID,
                   "--store", str(tmp_path / "runs.db"), cwd=tmp_path)


def test_the_undamaged_run_passes_the_file_checks(tmp_path):
    """The files above are sound: only the empty run store stops this resume."""
    _run_dir(tmp_path)
    done = _resume(tmp_path)
    _assert_one_line_error(done, f"run {RUN_ID} cannot be resumed")


@pytest.mark.parametrize("damage", RUN_DAMAGE, ids=list(RUN_DAMAGE))
def test_resume_from_damaged_files_is_one_line_and_exit_1(tmp_path, damage):
    run_dir = _run_dir(tmp_path)
    spoil, names = RUN_DAMAGE[damage]
    spoil(run_dir)
    done = _resume(tmp_path)
    _assert_one_line_error(done, names)
    assert os.fspath(run_dir) in done.stderr or RUN_ID in done.stderr
