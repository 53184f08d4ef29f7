"""examples/gpt end to end at small settings, through real node, coordinator and client
processes: the byte-level GPT on the standard-library corpus learns under both of its
configs (sync_sgd and DiLoCo), its model.safetensors loads strict into the plug-in's
module, and a node whose copy of the corpus differs is left out with one line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F

from devtools.local_cluster import REPO
from devtools.torch_baselines import evaluate

EXAMPLE = REPO / "examples" / "gpt"
sys.path.insert(0, str(EXAMPLE))

import gpt_model  # noqa: E402
import stdlib_corpus  # noqa: E402

TINY = {"block_size": 32, "d_model": 32, "n_layer": 1, "n_head": 2}
PLUGINS = ["--plugins", "gpt_model,stdlib_corpus", "--plugin-dir", str(EXAMPLE)]
RUN_SECONDS = 240.0
SMALL = {
    "sync_sgd.yaml": {"run.rounds": 24, "outputs.eval_every": 8,
                      "sync_sgd.images_per_work_unit": 16, "sync_sgd.batch_size": 16,
                      "sync_sgd.lr": 0.01},
    "diloco.yaml": {"run.rounds": 4, "outputs.eval_every": 1, "delta_avg.local_steps": 8,
                    "delta_avg.eta": 0.01},
}


def data_root(folder: Path, corpus: bytes | None = None) -> Path:
    """A data root; with ``corpus``, holding that copy of the corpus already."""
    if corpus is not None:
        (folder / stdlib_corpus.FOLDER).mkdir(parents=True)
        (folder / stdlib_corpus.FOLDER / stdlib_corpus.FILE).write_bytes(corpus)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def train(cluster, config: str, run_id: str, **more: object) -> dict:
    sets = {"run.model_args": json.dumps(TINY), "data.args": json.dumps(
        {"block_size": TINY["block_size"]}), "outputs.checkpoint_every": 0, **SMALL[config],
        **more}
    return cluster.train_json("--config", str(EXAMPLE / config), "--run-id", run_id,
                              *[arg for key, value in sets.items()
                                for arg in ("--set", f"{key}={value}")], timeout=RUN_SECONDS)


def next_byte_loss(model: torch.nn.Module, inputs: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(inputs).reshape(-1, 256), targets.reshape(-1))


def validation_losses(result: dict) -> list[float]:
    return [row["validation_loss"] for row in result["history"]
            if row["validation_loss"] is not None and not math.isnan(row["validation_loss"])]


@pytest.fixture(scope="module")
def gpt_cluster(module_cluster):
    """Two nodes and a coordinator with the example's plug-ins and one data root, which
    both configs train through, each run under its own run id."""
    root = data_root(module_cluster.workdir / "data")
    for _ in range(2):
        module_cluster.add_node(0.0, *PLUGINS, "--data-root", str(root))
    module_cluster.start_coordinator(2, *PLUGINS, "--data-root", str(root))
    return module_cluster


@pytest.mark.parametrize("config", ["sync_sgd.yaml", "diloco.yaml"])
def test_the_language_model_learns_and_its_file_loads_into_the_module(gpt_cluster, config):
    cluster, root = gpt_cluster, gpt_cluster.workdir / "data"
    result = train(cluster, config, Path(config).stem)
    validation = stdlib_corpus.stdlib_text(root, "validation", TINY["block_size"])
    torch.manual_seed(1)  # the run's seed: the coordinator's first weights
    untrained = evaluate(gpt_model.GPT(**TINY), next_byte_loss, validation)
    losses = validation_losses(result)
    assert abs(untrained - math.log(256)) < 0.1  # a model that knows nothing
    assert losses[-1] < untrained - 1.5, losses  # it learns, by a clear margin
    assert losses == sorted(losses, reverse=True), losses
    assert all(node["accepted"] > 0 for node in result["nodes"]), result["nodes"]
    model = gpt_model.GPT(**TINY)
    state = load_file(str(Path(result["coordinator_run_dir"]) / "model.safetensors"))
    model.load_state_dict(state, strict=True)
    # the file holds the trained weights: plain torch scores them as the run did
    assert evaluate(model, next_byte_loss, validation) == pytest.approx(losses[-1], abs=1e-4)
    text = gpt_model.sample(model, b"def ", 16)
    assert text.startswith(b"def ") and len(text) == 20


def test_a_node_with_another_copy_of_the_corpus_is_left_out_with_one_line(cluster):
    root = data_root(cluster.workdir / "data")
    text = stdlib_corpus.corpus(root)
    other = data_root(cluster.workdir / "other_python", text.replace(b"import", b"IMPORT", 1))
    cluster.add_node(0.0, *PLUGINS, "--data-root", str(root))
    odd = cluster.add_node(0.0, *PLUGINS, "--data-root", str(other))
    cluster.start_coordinator(2, *PLUGINS, "--data-root", str(root))
    result = train(cluster, "diloco.yaml", "odd-corpus", **{"run.rounds": 2})
    notes = {node["node"]: node["note"] for node in result["nodes"]}
    note = notes[f"127.0.0.1:{odd.port}"]
    assert "holds another copy of data set stdlib_corpus:stdlib_text" in note, notes
    assert "differ from the coordinator's" in note
    served = [node for node in result["nodes"] if node["accepted"]]
    assert [node["node"] for node in served] == [f"127.0.0.1:{cluster.nodes[0].port}"]
    assert len(validation_losses(result)) == 2
