"""bench/cnn_throughput.py: how many updates cover the epochs, which images are timed, the
baselines' step, the client's settings and the report (no process is started)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from devtools.throughput import PathResult

_PATH = Path(__file__).resolve().parents[2] / "bench" / "cnn_throughput.py"
_SPEC = importlib.util.spec_from_file_location("bench_cnn_throughput", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


@pytest.mark.parametrize(("epochs", "global_batch", "workers", "rounds"), [
    (5, 512, 1, 80),   # 15 units of 512 and one of 320 a pass, one a round
    (5, 512, 2, 80),   # 31 units of 256 and one of 64 a pass, two a round
    (2.5, 512, 2, 40),
    (1, 500, 1, 16), (1, 500, 2, 16),
    (0.01, 64, 1, 3),  # at least 3: one update is timed
])
def test_rounds_cover_the_epochs(epochs, global_batch, workers, rounds) -> None:
    assert bench.rounds_for(epochs, 8000, global_batch, workers) == rounds


def test_the_timed_images_leave_out_the_first_and_the_last_update() -> None:
    assert bench.window_images(8000, 500, 1, 10) == 8 * 500
    assert bench.window_images(8000, 500, 2, 10) == 8 * 500
    # units of 3,000 on 8,000 images: 3,000, 3,000, 2,000, then again from the start
    assert bench.window_images(8000, 3000, 1, 5) == 3000 + 2000 + 3000
    # two workers' units of 3,000 (rounds 2 and 3 of 4 are timed): units 3 to 6
    assert bench.window_images(8000, 6000, 2, 4) == 2000 + 3000 + 3000 + 2000


def test_a_step_on_micro_batches_is_the_step_on_the_whole_batch() -> None:
    torch.manual_seed(0)
    inputs, targets = torch.randn(10, 4), torch.randint(0, 3, (10,))
    whole, parts = nn.Linear(4, 3), nn.Linear(4, 3)
    parts.load_state_dict(whole.state_dict())
    optimizer = torch.optim.SGD(whole.parameters(), lr=0.1)
    optimizer.zero_grad()
    F.cross_entropy(whole(inputs), targets).backward()
    optimizer.step()
    bench.train_step(parts, torch.optim.SGD(parts.parameters(), lr=0.1), inputs, targets, 4)
    for a, b in zip(whole.parameters(), parts.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_client_runs_the_example_with_the_bench_sizes() -> None:
    args = bench.client_args(2, 20, 512, 128, 0.004, {"width": 8})
    assert args[:2] == ["--config", str(bench.RUN_CONFIG)]
    sets = dict(a.split("=", 1) for a in args[3::2])
    assert sets["sync_sgd.images_per_work_unit"] == "256"
    assert sets["sync_sgd.num_workunits_per_update"] == sets["sync_sgd.units_per_iteration"] \
        == "2"
    assert sets["outputs.eval_every"] == "20"  # scored once, after the last round
    assert sets["run.model_args"] == '{"width": 8}'


def test_the_report_gives_each_system_path_its_baselines_ratio() -> None:
    def path(label: str, workers: int, seconds: float, **extra: float) -> PathResult:
        return PathResult(label, workers, 512, 8, seconds,
                          {"images_timed": 4096, "accuracy": 0.97, **extra})

    system = {"round_seconds": 0.5, "units_phase_seconds": 0.45,
              "node_unit_seconds": 0.4, "slowest_unit_seconds": 0.42,
              "aggregate_phase_seconds": 0.01,
              "between_rounds_seconds": 0.002}
    results = {"a": path("(a) single", 1, 4.0), "c": path("(c) ours, 1 node", 1, 5.0, **system),
               "b": path("(b) ddp", 2, 2.0), "d": path("(d) ours, 2 nodes", 2, 2.0, **system)}
    results["d"].extra["accuracy"] = 0.955
    settings = {"model": bench.MODEL, "model_args": {"width": 16}, "parameters": 77754,
                "global_batch": 512, "batch": 128, "lr": 0.004, "epochs": 5, "images": 8000,
                "allocator": "freed memory kept"}
    text = bench.report(results, settings)
    assert "| (c) ours, 1 node | 512 | 8 | 5.0 | 819 | **0.80x (a)** | 0.9700 |" in text
    assert "(c) - (a) = +0.0000, (d) - (b) = -0.0150" in text
    assert "**1.00x (b)**" in text
    assert "| baseline step | 500.0 | 250.0 |" in text
    assert "| the round's slowest unit | 420.0 | 420.0 |" in text
    assert text.index("(b) ddp") < text.index("(c) ours")  # rows in the order of their keys
    assert math.isclose(bench.images_per_second(results["a"]), 1024)
