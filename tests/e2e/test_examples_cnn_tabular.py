"""The CNN and tabular examples (examples/cnn, examples/tabular) end to end at small sizes:
real nodes, coordinator and client, learning that shows in the validation error, and the
run's model.safetensors loaded strictly into the module with plain torch, scoring as the
run said."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from devtools.local_cluster import REPO
from thrift_trainer.training.data import mnist

CNN = REPO / "examples" / "cnn"
TABULAR = REPO / "examples" / "tabular"
LETTERS = REPO / "data" / "letters"
RUN_SECONDS = 300.0
SAME_SCORE = 1e-3  # two of 2,000 images: other batch sizes may round a close call otherwise


def sets(**settings: object) -> list[str]:
    return [a for key, value in settings.items()
            for a in ("--set", f"{key.replace('__', '.')}={value}")]


def evaluated(result: dict) -> list[float]:
    return [h["validation_error"] for h in result["history"]
            if not math.isnan(h["validation_error"])]


def error_rate(module: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    module.eval()
    with torch.no_grad():
        return float((module(inputs).argmax(dim=1) != labels).float().mean())


def plugin_module(path: Path) -> ModuleType:
    """The example's module as a user's script imports it (not through the trainer)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_nodes(module_cluster):
    """Two nodes and a coordinator allowing the CNN example's plug-in (the tabular example
    needs none), which both examples train through, each under its own run id."""
    allow = ("--plugins", "resnet_cnn", "--plugin-dir", str(CNN))
    module_cluster.add_node(0.0, *allow)
    module_cluster.add_node(0.0, *allow)
    module_cluster.start_coordinator(2, *allow)
    return module_cluster


def test_the_cnn_example_learns_and_its_model_loads_into_the_module(two_nodes):
    result = two_nodes.train_json(
        "--config", str(CNN / "run.yaml"), "--run-id", "cnn",
        *sets(run__rounds=40, run__model_args="{width: 8}",
              sync_sgd__images_per_work_unit=32, sync_sgd__batch_size=16,
              sync_sgd__lr=0.005, outputs__eval_every=10, outputs__checkpoint_every=0),
        timeout=RUN_SECONDS)
    errors = evaluated(result)
    assert len(errors) == 4, result["history"]
    assert errors[-1] < errors[0] - 0.2, errors  # chance is 0.9

    model = plugin_module(CNN / "resnet_cnn.py").ResNetCNN(input_shape=[1, 28, 28],
                                                           num_classes=10, width=8)
    state = load_file(Path(result["coordinator_run_dir"]) / "model.safetensors")
    model.load_state_dict(state, strict=True)
    images, labels = mnist.held_out_part()
    inputs = mnist.to_model_input(images)
    assert math.isclose(error_rate(model, inputs, torch.from_numpy(labels.astype("int64"))),
                        result["validation_error"], abs_tol=SAME_SCORE)


def test_the_tabular_example_learns_from_a_config_alone(two_nodes):
    result = two_nodes.train_json("--config", str(TABULAR / "letters_csv.yaml"),
                                  "--run-id", "tabular",
                                  *sets(run__rounds=3, delta_avg__epochs=1),
                                  timeout=RUN_SECONDS)
    errors = evaluated(result)
    assert len(errors) == 3
    assert errors[-1] < errors[0] - 0.05 and errors[-1] < 0.5, errors  # chance is 0.96

    # The model file holds mlp_classifier's layers: plain torch rebuilds and loads it.
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128),
                          nn.ReLU(), nn.Linear(128, 26))
    state = load_file(Path(result["coordinator_run_dir"]) / "model.safetensors")
    model.load_state_dict(state, strict=True)
    train = torch.cat([_table(path) for path in sorted(LETTERS.glob("train_*.txt"))])
    validation = _table(LETTERS / "validate_letters.txt")
    mean, std = train[:, :-1].mean(dim=0), train[:, :-1].std(dim=0)
    inputs = (validation[:, :-1] - mean) / std  # data.normalize: the training part's statistics
    assert math.isclose(error_rate(model, inputs, validation[:, -1].long()),
                        result["validation_error"], abs_tol=SAME_SCORE)


def _table(path: Path) -> torch.Tensor:
    rows = [[float(v) for v in line.split(",")] for line in path.read_text().splitlines()
            if line.strip()]
    return torch.tensor(rows, dtype=torch.float32)
