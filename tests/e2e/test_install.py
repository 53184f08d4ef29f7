"""The trainer as a researcher installs it: pip with the tracking extra into a fresh virtual
environment, a model and a batch transform of one's own in a folder outside the repository,
the installed console scripts training it with a schedule, clipping and augmentation, the
TensorBoard and MLflow records read back with their own readers, a sweep over two seeds
compared, the model scored with `evaluate` and `predict`, and model.safetensors loaded into
that model with plain torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from devtools.local_cluster import REPO, python_env, start_command, write_nodes_file
from thrift_trainer.training.data.mnist import held_out_part

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MY_MODELS = """
import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 8, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(channels * 14 * 14, num_classes))

    def forward(self, x):
        return self.net(x)


def jitter(inputs, targets, generator):  # noise drawn by the run's seeded generator
    return inputs + 0.05 * torch.randn(inputs.shape, generator=generator), targets
"""
RUN = ["--set", "run.algorithm=sync_sgd", "--set", "run.model=my_models:SmallCNN",
       "--set", "run.dataset=mnist", "--set", "run.rounds=3",
       "--set", "sync_sgd.images_per_work_unit=128", "--set", "sync_sgd.units_per_iteration=2",
       "--set", "sync_sgd.num_workunits_per_update=2", "--set", "sync_sgd.lr=0.003"]
# the loop a researcher shapes: a schedule, clipping, augmentation and a transform of theirs
SHAPED = ["--set", "run.lr_schedule=warmup_cosine", "--set", "run.warmup_steps=1",
          "--set", "run.clip_norm=1.0", "--set", "data.augment=crop",
          "--set", "data.transform=my_models:jitter"]
# TensorBoard's and MLflow's own readers, in the installed environment: every round's metric
READ_TRACKS = """
import json, sys
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

events = EventAccumulator(sys.argv[1])
events.Reload()
client = MlflowClient(tracking_uri=sys.argv[2])
runs = client.search_runs([client.get_experiment_by_name("thrift-trainer").experiment_id])
(run,) = [run for run in runs if run.info.run_name == sys.argv[3]]
history = client.get_metric_history(run.info.run_id, "validation_error")
print(json.dumps({
    "board": [[s.step, s.value] for s in events.Scalars("validation_error")],
    "mlflow": sorted([m.step, m.value] for m in history), "name": run.info.run_name,
    "status": run.info.status, "params": run.data.params,
    "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id))}))
"""
# Plain torch and safetensors, in the installed environment: the run's file loaded into
# the user's module, strictly; where the trainer was imported from, and the file's metadata.
LOAD = """
import json, sys
from safetensors import safe_open
from safetensors.torch import load_file
import thrift_trainer
from my_models import SmallCNN

model = SmallCNN()
state = load_file(sys.argv[1])
model.load_state_dict(state, strict=True)
with safe_open(sys.argv[1], "pt") as f:
    metadata = f.metadata()
print(json.dumps({"tensors": sorted(state), "module": sorted(model.state_dict()),
                  "trainer": thrift_trainer.__file__, "plugins": metadata["plugins"],
                  "config": json.loads(metadata["config"])}))
"""
INSTALL_SECONDS = 600  # torch's wheel is unpacked from this machine's disk


def project_copy(target: Path) -> Path:
    """The working tree as a fresh clone would hold it (tracked files and new ones git does
    not ignore), so that building it writes nothing into the repository."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file() and not name.startswith(("data/", "examples/")):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_pip_install_with_tracking_trains_sweeps_and_scores_a_model_of_ones_own(tmp_path):
    venv = _installed(tmp_path)
    scripts = venv / "bin"
    work = tmp_path / "work"  # the user's folder, outside the repository
    work.mkdir()
    (work / "my_models.py").write_text(MY_MODELS)
    env = {key: value for key, value in python_env().items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    common = ["--host", "127.0.0.1", "--plugins", "my_models",
              "--data-root", str(REPO / "data")]
    procs = []
    try:
        # the first start imports torch from sources not yet compiled: give it time
        for name in ("node1", "node2"):
            procs.append(start_command([str(scripts / "trainer-node"), "0", "0", *common],
                                       work, name, env=env, ready_seconds=120))
        # read from the current folder by default, as the run folder is written there
        write_nodes_file(work / "compute_nodes.txt", procs)
        coordinator = start_command(
            [str(scripts / "trainer-coordinator"), "0", "2", *common, "--track",
             "tensorboard:board", "--track", f"mlflow:sqlite:///{work / 'mlflow.db'}"],
            work, "coordinator", env=env, ready_seconds=120)
        procs.append(coordinator)
        endpoint = ["127.0.0.1", str(coordinator.port)]
        # the first run imports MLflow and TensorBoard in the coordinator from sources this
        # fresh environment has not compiled yet: seconds on a busy machine
        done = _command(scripts, work, env, *endpoint, *RUN, *SHAPED, "--run-id", "installed",
                        "--json", "--dead-after", "60", logs=procs)
        result = json.loads(done.stdout)
        assert len(result["history"]) == 3
        assert result["validation_error"] < 0.85, result["history"]  # chance: 0.9
        swept = _command(scripts, work, env, "sweep", *endpoint, *RUN, "--set",
                         "run.rounds=2", "--grid", "sync_sgd.lr=0.001,0.003", "--seeds", "1,2",
                         "--name", "lr", "--quiet", logs=procs)
    finally:
        for proc in procs:
            proc.stop()

    _check_tracks(scripts, work, env, result)
    _check_sweep(work / "sweeps" / "lr", swept.stdout)
    _check_scores(scripts, work, env, result)
    loaded = _command(scripts, work, env, "-c", LOAD,
                      str(work / "runs" / "installed" / "model.safetensors"), program="python")
    facts = json.loads(loaded.stdout)
    assert facts["tensors"] == facts["module"]  # BatchNorm's buffers included
    assert "net.1.running_mean" in facts["tensors"]
    assert Path(facts["trainer"]).is_relative_to(venv), facts["trainer"]
    assert "my_models" in facts["plugins"]
    settings = dict(_leaves(facts["config"]))  # the shaped loop, recorded with the model
    assert settings["lr_schedule"] == "warmup_cosine" and settings["clip_norm"] == 1.0
    assert settings["augment"] == "crop" and settings["transform"] == "my_models:jitter"


def _installed(tmp_path: Path) -> Path:
    """A fresh virtual environment with the working tree and its tracking extra installed,
    checked to hold the dashboard's files and no top-level name but the trainer's own."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    before = {path.name for path in site_packages.iterdir()}
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
         f"{project_copy(tmp_path / 'project')}[tracking]"],
        capture_output=True, text=True, timeout=INSTALL_SECONDS)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # the dashboard's pages and the chart library they load
    assert list(site_packages.glob("thrift_trainer/dashboard/static/vendor/uplot/*.js"))
    # the trainer's own names at the top of site-packages: one package (its dependencies
    # are packages of their own, each with its .dist-info)
    ours = {path.name for path in site_packages.iterdir()} - before
    dependencies = _names_of_other_distributions(site_packages)
    assert {name for name in ours - dependencies if not name.endswith(".dist-info")} \
        == {"thrift_trainer"}, ours - dependencies
    return venv


def _command(scripts: Path, work: Path, env: dict[str, str], *args: str,
             program: str = "trainer-client", logs: list = ()) -> subprocess.CompletedProcess:
    """An installed command, run in the user's folder; it must succeed."""
    done = subprocess.run([str(scripts / program), *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + "\n".join(p.log() for p in logs)
    return done


def _check_tracks(scripts: Path, work: Path, env: dict[str, str], result: dict) -> None:
    """Every round's validation error in TensorBoard and MLflow, as the client printed it."""
    read = _command(scripts, work, env, "-c", READ_TRACKS, str(work / "board" / "installed"),
                    f"sqlite:///{work / 'mlflow.db'}", "installed", program="python")
    tracks = json.loads(read.stdout)
    errors = [[row["round"], row["validation_error"]] for row in result["history"]]
    for name in ("board", "mlflow"):
        assert [step for step, _ in tracks[name]] == [1, 2, 3], tracks
        assert [value for _, value in tracks[name]] == \
            pytest.approx([value for _, value in errors], rel=1e-6), tracks  # float32 kept
    assert tracks["status"] == "FINISHED" and tracks["params"]["algorithm"] == "sync_sgd"
    assert "model.safetensors" in tracks["artifacts"], tracks["artifacts"]


def _check_sweep(folder: Path, printed: str) -> None:
    """Two settings over two seeds, compared: mean and spread per setting."""
    compared = json.loads((folder / "compare.json").read_text())
    settings = {row["setting"]: row for row in compared["settings"]}
    assert set(settings) == {"lr=0.001", "lr=0.003"}, settings
    assert all(row["seeds"] == [1, 2] for row in settings.values()), settings
    assert "lr=0.003" in printed and "picture:" in printed, printed


def _check_scores(scripts: Path, work: Path, env: dict[str, str], result: dict) -> None:
    """`evaluate` on MNIST's held-out part scores what the coordinator scored; `predict`
    labels images the user saved."""
    model = str(work / result["export"])
    scored = _command(scripts, work, env, "evaluate", model, "--data", str(REPO / "data" /
                      "mnist"), "--plugins", "my_models", "--json")
    scores = json.loads(scored.stdout)
    assert abs(scores["error"] - result["validation_error"]) < 1e-6, (scores, result)
    images = work / "digits"
    images.mkdir()
    for index, pixels in enumerate(held_out_part(REPO / "data" / "mnist")[0][:3]):
        Image.fromarray(pixels).save(images / f"digit{index}.png")
    lines = _command(scripts, work, env, "predict", model, str(images), "--plugins",
                     "my_models").stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == \
        [str(images / f"digit{index}.png") for index in range(3)], lines
    assert all(line.split("\t")[1] in "0123456789" for line in lines), lines


def _leaves(tree: dict) -> list[tuple[str, object]]:
    """Every (key, value) of a nested mapping whose value is not itself a mapping."""
    found = []
    for key, value in tree.items():
        found.extend(_leaves(value) if isinstance(value, dict) else [(key, value)])
    return found


def _names_of_other_distributions(site_packages: Path) -> set[str]:
    """The top-level names of site-packages that distributions other than the trainer's
    installed (their RECORD files list them), their .dist-info folders included."""
    names = set()
    for record in site_packages.glob("*.dist-info/RECORD"):
        if not record.parent.name.startswith("thrift_trainer-"):
            names |= {line.split(",", 1)[0].split("/", 1)[0]
                      for line in record.read_text().splitlines()}
    return names
