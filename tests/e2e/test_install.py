"""The trainer as a user installs it: pip into a fresh virtual environment, a model of one's
own in a folder outside the repository, the installed console scripts, and the run's
model.safetensors loaded into that model with plain torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.local_cluster import REPO, python_env, start_command, write_nodes_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MY_MODELS = """
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 8, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(channels * 14 * 14, num_classes))

    def forward(self, x):
        return self.net(x)
"""
RUN = ["--set", "run.algorithm=sync_sgd", "--set", "run.model=my_models:SmallCNN",
       "--set", "run.dataset=mnist", "--set", "run.rounds=3",
       "--set", "sync_sgd.images_per_work_unit=128", "--set", "sync_sgd.units_per_iteration=2",
       "--set", "sync_sgd.num_workunits_per_update=2", "--set", "sync_sgd.lr=0.003"]
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
                  "trainer": thrift_trainer.__file__, "plugins": metadata["plugins"]}))
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


def test_pip_install_trains_a_model_of_ones_own_through_the_console_scripts(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site_packages = next(venv.glob("lib/python*/site-packages"))
    before = {path.name for path in site_packages.iterdir()}
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile",
         str(project_copy(tmp_path / "project"))],
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

    work = tmp_path / "work"  # the user's folder, outside the repository
    work.mkdir()
    (work / "my_models.py").write_text(MY_MODELS)
    env = {key: value for key, value in python_env().items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    scripts = venv / "bin"
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
        coordinator = start_command([str(scripts / "trainer-coordinator"), "0", "2", *common],
                                    work, "coordinator", env=env, ready_seconds=120)
        procs.append(coordinator)
        done = subprocess.run(
            [str(scripts / "trainer-client"), "127.0.0.1", str(coordinator.port), *RUN,
             "--run-id", "installed", "--json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=300)
        logs = "\n".join(p.log() for p in procs)
        assert done.returncode == 0, done.stdout + done.stderr + logs
        result = json.loads(done.stdout)
        assert len(result["history"]) == 3
        assert result["validation_error"] < 0.85, result["history"]  # chance: 0.9
    finally:
        for proc in procs:
            proc.stop()

    loaded = subprocess.run(
        [str(scripts / "python"), "-c", LOAD, str(work / "runs" / "installed" /
                                                  "model.safetensors")],
        cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    facts = json.loads(loaded.stdout)
    assert facts["tensors"] == facts["module"]  # BatchNorm's buffers included
    assert "net.1.running_mean" in facts["tensors"]
    assert Path(facts["trainer"]).is_relative_to(venv), facts["trainer"]
    assert "my_models" in facts["plugins"]



def _names_of_other_distributions(site_packages: Path) -> set[str]:
    """The top-level names of site-packages that distributions other than the trainer's
    installed (their RECORD files list them), their .dist-info folders included."""
    names = set()
    for record in site_packages.glob("*.dist-info/RECORD"):
        if not record.parent.name.startswith("thrift_trainer-"):
            names |= {line.split(",", 1)[0].split("/", 1)[0]
                      for line in record.read_text().splitlines()}
    return names
