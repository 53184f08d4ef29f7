"""bench/big_model.py and bench/wire_bench.py --big: the model's size, the synthetic data
set, and the tables they print from measured figures (no process is started)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


big_model = _load("big_model")
wire_bench = _load("wire_bench")


def test_the_default_width_makes_a_model_of_over_a_gibibyte() -> None:
    assert big_model.parameters(16384) * 4 > 2**30
    assert big_model.parameters(8192) * 4 < 2**30


def test_the_synthetic_data_set_is_a_train_and_a_validation_table(tmp_path: Path) -> None:
    big_model.write_data(tmp_path)
    with np.load(tmp_path / "synthetic" / "train.npz") as train:
        assert train["x"].shape == (1024, big_model.FEATURES)
        assert train["x"].dtype == np.float32
        assert set(np.unique(train["y"])) <= set(range(big_model.CLASSES))
    with np.load(tmp_path / "synthetic" / "validation.npz") as held:
        assert held["x"].shape == (64, big_model.FEATURES)


def test_the_round_table_splits_a_unit_into_transfer_and_maths() -> None:
    node = {"accepted": 3, "compute_seconds": 9.0, "busy_seconds": 15.0,
            "delay_seconds": 0.0}
    data = {"model_bytes": 2**30, "wall": 40.0,
            "peaks": {"coordinator": 9 * 2**30, "node 1": 4 * 2**30},
            "result": {"rounds": 3, "nodes": [node, node], "bytes_down": 6 * 2**30,
                       "bytes_up": 6 * 2**30,
                       "history": [{"round": r, "seconds": 7.0, "update_seconds": 2.5,
                                    "validation_error": 0.9} for r in (1, 2, 3)]}}
    table = big_model.table(data)
    assert "| transfer: weights down and gradient up, encoded and decoded | 2.00 |" in table
    assert "| maths: the node's forward and backward passes | 3.00 |" in table
    assert "| coordinator | 9.00 GiB |" in table
    assert "model: 1.00 GiB of float32 parameters; 3 rounds in 40 s" in table


def test_the_big_wire_table_gives_each_sides_memory_beyond_the_tensor() -> None:
    memory = {"sender": 0, "receiver": 4096 * 2**20 + 2 * 2**20}
    table = wire_bench.big_table(3, [(4096, 2000.0, 1700.0, memory)])
    assert "| 4,096 MiB | 2,000 | 1,700 | 0.85 | 0.0 MiB | 2.0 MiB |" in table


@pytest.mark.parametrize("argv", [["--big"], ["--big", "--big-sizes-mib", "256"]])
def test_big_payloads_are_an_option_of_the_wire_bench(argv: list[str]) -> None:
    args = wire_bench.parse_args(argv)
    assert args.big and [int(s) for s in args.big_sizes_mib.split(",")][0] == 256


@pytest.mark.parametrize(("optimizer", "lr"), [("adam", "0.001"), ("sgd", "0.01")])
def test_the_coordinators_optimizer_is_the_runs_with_its_usual_rate(optimizer: str,
                                                                    lr: str) -> None:
    args = big_model.client_args(8192, 3, optimizer)
    sets = dict(arg.split("=", 1) for arg in args[1::2])
    assert args[::2] == ["--set"] * len(sets)
    assert sets["sync_sgd.optimizer"] == optimizer and sets["sync_sgd.lr"] == lr
    assert json.loads(sets["run.model_args"]) == {"width": 8192}
