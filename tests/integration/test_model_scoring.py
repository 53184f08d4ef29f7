"""A plug-in torch model trained through real node, coordinator and client processes on
127.0.0.1, then used from the client's saved files: `client.py evaluate` scores what the
coordinator scored on the same data, and `predict` answers in the label names, with the
preprocessing (normalisation, image scaling) the model file records applied again."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from devtools import local_cluster as procs
from tests.conftest import Cluster

KINDS = ("ant", "bee", "cow")
SHADES = {"dark": 50, "light": 200}
MODULE = textwrap.dedent('''
    from torch import nn


    def tiny(in_features, num_classes, width=8):
        return nn.Sequential(nn.Flatten(), nn.Linear(in_features, width), nn.ReLU(),
                             nn.Linear(width, num_classes))
    ''')
PLUGINS = ("--plugins", "tiny_models")
RUN = ["--set", "run.algorithm=delta_avg", "--set", "run.model=tiny_models:tiny",
       "--set", "run.rounds=2", "--set", "delta_avg.units=2", "--set", "delta_avg.epochs=2",
       "--set", "delta_avg.local_optimizer=adam", "--set", "delta_avg.eta=0.05"]
SAME = 1e-6


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root: a CSV table with a header and word labels on unequal scales (so the
    normalisation matters), and a folder of class folders of images."""
    tmp_path = tmp_path_factory.mktemp("root")
    rng = np.random.default_rng(0)
    table = tmp_path / "data" / "animals"
    table.mkdir(parents=True)
    for name, rows in (("train.csv", 90), ("held.csv", 45)):
        kinds = rng.integers(0, len(KINDS), rows)
        (table / name).write_text("size,legs,kind\n" + "".join(
            f"{100 * k + 30 * rng.normal():.3f},{k + rng.normal():.3f},{KINDS[k]}\n"
            for k in kinds))
    for part, count in (("train", 8), ("validation", 5)):
        for label, shade in SHADES.items():
            folder = tmp_path / "data" / "shapes" / part / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(shade + rng.normal(0, 40, (9, 11)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return tmp_path / "data"


@pytest.fixture(scope="module")
def trained_cluster(module_cluster: Cluster, root: Path) -> Cluster:
    """Two nodes and a coordinator on that root allowing the plug-in module, which both
    tests train through, each run under its own run id."""
    cluster = module_cluster
    (cluster.workdir / "tiny_models.py").write_text(MODULE, encoding="utf-8")
    for _ in range(2):
        cluster.add_node(0.0, "--data-root", str(root), *PLUGINS)
    cluster.start_coordinator(2, "--data-root", str(root), *PLUGINS)
    return cluster


def client(cluster: Cluster, *args: str) -> str:
    done = procs.run_client([*args, *PLUGINS], cluster.workdir, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_table_model_is_evaluated_as_the_coordinator_scored_it_and_predicts_label_names(
        trained_cluster: Cluster, root: Path) -> None:
    held = root / "animals" / "held.csv"
    result = trained_cluster.train_json(
        *RUN, "--set", "run.dataset=animals", "--set", "data.format=csv",
        "--set", "data.label=kind", "--set", "data.validation=held.csv",
        "--set", "data.normalize=true", "--run-id", "table", timeout=180)
    npz = trained_cluster.workdir / result["model_path"]
    exported = trained_cluster.workdir / result["export"]
    assert exported == npz.with_suffix(".safetensors") and exported.is_file()

    for saved in (npz, exported):
        scores = json.loads(client(trained_cluster, "evaluate", str(saved), "--data",
                                   str(held), "--json"))
        assert scores["metric"] == "error_rate" and scores["rows"] == 45
        assert abs(scores["error"] - result["validation_error"]) < SAME, (scores, result)
        assert abs(scores["loss"] - result["history"][-1]["validation_loss"]) < SAME
    labels = client(trained_cluster, "predict", str(exported), str(held)).split()
    assert len(labels) == 45 and set(labels) <= set(KINDS), labels
    # the model learnt the table, so its predictions track the labels it was scored on
    truth = [line.rsplit(",", 1)[1] for line in held.read_text().splitlines()[1:]]
    wrong = sum(a != b for a, b in zip(labels, truth, strict=True)) / len(truth)
    assert abs(wrong - result["validation_error"]) < SAME


def test_an_image_model_is_evaluated_on_its_folder_and_predicts_each_image(
        trained_cluster: Cluster, root: Path) -> None:
    result = trained_cluster.train_json(
        *RUN, "--set", "run.dataset=shapes", "--set", "data.format=images",
        "--set", "data.image_size=6", "--set", "data.channels=1", "--run-id", "images",
        timeout=180)
    exported = trained_cluster.workdir / result["export"]
    scores = json.loads(client(trained_cluster, "evaluate", str(exported), "--data",
                               str(root / "shapes" / "validation"), "--json"))
    assert abs(scores["error"] - result["validation_error"]) < SAME, (scores, result)
    lines = client(trained_cluster, "predict", str(exported),
                   str(root / "shapes" / "validation")).splitlines()
    assert len(lines) == 10
    assert {line.split("\t")[1] for line in lines} <= set(SHADES), lines
