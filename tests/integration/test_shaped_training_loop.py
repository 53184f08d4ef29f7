"""A torch model trained through real node, coordinator and client processes on 127.0.0.1
with the training loop shaped by settings: a cosine schedule with warm-up, gradient
clipping, bf16, augmented and normalised images and a transform plug-in. The run's
loss falls, and its model.safetensors names every setting, in the run's config and in the
description."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import Cluster
from thrift_trainer.training.outputs.torch_files import read_safetensors

MODULE = textwrap.dedent('''
    import torch
    from torch import nn


    def tiny(in_features, num_classes, width=8):
        return nn.Sequential(nn.Flatten(), nn.Linear(in_features, width), nn.ReLU(),
                             nn.Linear(width, num_classes))


    def noisy(inputs, targets, generator):
        return inputs + 0.05 * torch.randn(inputs.shape, generator=generator), targets
    ''')
PLUGINS = ("--plugins", "loop_plugins")
SHAPED = ["--set", "run.model=loop_plugins:tiny", "--set", "run.dataset=shades",
          "--set", "data.image_size=12", "--set", "data.mean=[0.0]", "--set", "data.std=[0.5]",
          "--set", "data.augment=crop_flip", "--set", "data.crop_padding=2",
          "--set", "data.transform=loop_plugins:noisy", "--set", "data.prefetch=2",
          "--set", "run.lr_schedule=warmup_cosine", "--set", "run.warmup_steps=2",
          "--set", "run.clip_norm=1.0", "--set", "run.precision=bf16",
          "--set", "run.rounds=3"]
LOCAL = ["--set", "run.algorithm=delta_avg", "--set", "delta_avg.units=2",
         "--set", "delta_avg.epochs=2", "--set", "delta_avg.batch_size=8",
         "--set", "delta_avg.local_optimizer=adam", "--set", "delta_avg.eta=0.05",
         "--set", "run.server_lr_schedule=linear"]
SYNC = ["--set", "run.algorithm=sync_sgd", "--set", "sync_sgd.images_per_work_unit=16",
        "--set", "sync_sgd.num_workunits_per_update=2",
        "--set", "sync_sgd.units_per_iteration=2", "--set", "sync_sgd.lr=0.05"]


@pytest.fixture
def shades(cluster: Cluster, tmp_path: Path) -> Cluster:
    """Two nodes and a coordinator over a folder of dark and light grey images."""
    rng = np.random.default_rng(0)
    for part, count in (("train", 24), ("validation", 8)):
        for label, shade in (("dark", 60), ("light", 190)):
            folder = tmp_path / "data" / "shades" / part / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(shade + rng.normal(0, 40, (12, 12)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    (cluster.workdir / "loop_plugins.py").write_text(MODULE, encoding="utf-8")
    root = ("--data-root", str(tmp_path / "data"))
    for _ in range(2):
        cluster.add_node(0.0, *root, *PLUGINS)
    cluster.start_coordinator(2, *root, *PLUGINS)
    return cluster


@pytest.mark.parametrize("algorithm", [pytest.param(LOCAL, id="delta_avg"),
                                       pytest.param(SYNC, id="sync_sgd")])
def test_a_shaped_loop_trains_and_its_model_file_names_every_setting(shades, algorithm):
    result = shades.train_json(*SHAPED, *algorithm, timeout=180)
    losses = [round_["validation_loss"] for round_ in result["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0], losses

    _, metadata = read_safetensors(Path(result["coordinator_run_dir"]) / "model.safetensors")
    config, description = json.loads(metadata["config"]), json.loads(metadata["description"])
    loop = {"lr_schedule": "warmup_cosine", "warmup_steps": 2, "lr_rounds": 3,
            "clip_norm": 1.0, "precision": "bf16"}
    assert loop.items() <= config["model"].items(), config["model"]
    shaping = {"augment": "crop_flip", "crop_padding": 2, "transform": "loop_plugins:noisy",
               "prefetch": 2}
    assert shaping.items() <= config["data"].items(), config["data"]
    training = description["training"]
    assert loop.items() <= training.items()
    assert {f"data.{key}": value for key, value in shaping.items()}.items() <= \
        training.items()
    assert description["data"]["normalize"] == {"per": "channel", "mean": [0.0],
                                                "std": [0.5]}
