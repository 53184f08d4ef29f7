"""The byte-level GPT of examples/gpt as the language-model benches train it, in plain torch
and through the trainer's processes (bench/lm_throughput.py, bench/diloco.py).

The model is built as a run's coordinator builds it (drawn from the run's seed), the
optimizer is sync_sgd's AdamW on the coordinator, the loss the trainer's default for
integer targets (cross-entropy over the last dimension), and the data the plug-in data set
itself, so that a baseline and a run train the same maths on the same windows.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from devtools.local_cluster import REPO
from devtools.torch_baselines import Workload

EXAMPLE = REPO / "examples" / "gpt"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

import gpt_model  # noqa: E402
import stdlib_corpus  # noqa: E402

BLOCK = 128  # bytes per window: examples/gpt's configs
MODEL_ARGS = {"block_size": BLOCK, "d_model": 128, "n_layer": 6, "n_head": 4}  # 1.27 M
TINY_ARGS = {"block_size": BLOCK, "d_model": 32, "n_layer": 1, "n_head": 2}  # for checks
SEED = 1  # run.seed of the runs
PLUGINS = ["--plugins", "gpt_model,stdlib_corpus", "--plugin-dir", str(EXAMPLE)]


def build_model(args: dict[str, Any], seed: int = SEED) -> nn.Module:
    """The model a run's coordinator starts from: drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return gpt_model.GPT(**args)


def parameters(args: dict[str, Any]) -> int:
    return sum(p.numel() for p in build_model(args).parameters())


def adamw(module: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """sync_sgd's optimizer ``adamw`` on the coordinator."""
    return torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.999),
                             weight_decay=weight_decay)


def next_byte_loss(model: nn.Module, inputs: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every position's scores against the next byte."""
    scores = model(inputs)
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1))


def windows(data_root: Path, split: str) -> stdlib_corpus.ByteWindows:
    return stdlib_corpus.stdlib_text(data_root, split, BLOCK)


def workload(model_args: dict[str, Any], data_root: Path, unit: int, batch: int, lr: float,
             weight_decay: float, device: str = "cpu") -> Workload:
    """The plain-torch baselines' view of a sync_sgd run of the example."""
    return Workload(model=functools.partial(build_model, model_args),
                    optimizer=functools.partial(adamw, lr=lr, weight_decay=weight_decay),
                    data=functools.partial(windows, data_root, "train"), loss=next_byte_loss,
                    unit=unit, batch=batch, device=device)


def data_root(folder: Path) -> Path:
    """A data root holding the corpus, written once for every process of a bench."""
    folder.mkdir(parents=True, exist_ok=True)
    stdlib_corpus.corpus(folder)
    return folder


def client_args(config: str, sets: dict[str, Any]) -> list[str]:
    """The client's arguments for one of the example's configs with ``--set`` overrides."""
    return ["--config", str(EXAMPLE / config),
            *[arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]]


def add_output_options(parser: argparse.ArgumentParser, results: Path) -> None:
    """A language-model bench's --tiny (a model small enough to check the bench itself)
    and --out (where the figures go: ``results`` by default, nowhere with --tiny)."""
    parser.add_argument("--tiny", action="store_true",
                        help="a 1-layer model of width 32, to check the bench quickly")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where the figures go (default {results}; none with --tiny)")
