"""bench/topk_horizon.py: its replays are the system's maths, and its table reads them."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "topk_horizon.py"
_SPEC = importlib.util.spec_from_file_location("bench_topk_horizon", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclass looks its module up there
_SPEC.loader.exec_module(bench)


@pytest.fixture(scope="module")
def dense() -> bench.Replay:
    return bench.variant("none", 1)


def test_sending_every_entry_replays_the_dense_run(dense: bench.Replay) -> None:
    assert bench.variant("topk 100%", 1).errors == dense.errors
    assert bench.variant("coordinator top 100%", 1).errors == dense.errors


def test_topk_sends_fewer_bytes_and_keeps_the_rest_for_later(dense: bench.Replay) -> None:
    sparse = bench.variant("topk 1%", 1)
    assert 40 < dense.bytes_sent[0] / sparse.bytes_sent[0] < 100  # values + int32 indices
    assert sparse.errors[0] > dense.errors[0]


def test_an_unknown_variant_is_named() -> None:
    with pytest.raises(ValueError, match="'topk one'"):
        bench.variant("topk one", 1)


def test_the_row_names_the_first_round_on_target_and_the_bytes_to_it() -> None:
    base = bench.Replay(errors=[0.5] * 9 + [0.10], bytes_sent=[100 * r for r in range(1, 11)])
    slow = bench.Replay(errors=[0.5] * 10 + [0.13, 0.11], bytes_sent=list(range(1, 13)))
    assert bench.row("slow", slow, base, 0.02, idealised=False) == (
        "| slow | 0.5000 | 0.1100 | 12 (0.1100) | 83.3x fewer |")
    never = bench.Replay(errors=[0.5] * 12, bytes_sent=list(range(1, 13)))
    assert "not reached" in bench.row("never", never, base, 0.02, idealised=False)


def test_recipe_changes_are_read_as_yaml_and_checked_by_the_algorithm() -> None:
    assert bench.parse_set("hidden=[64, 32]") == ("hidden", [64, 32])
    assert bench.recipe_algorithm({"epochs": 2}).config["epochs"] == 2
    with pytest.raises(ValueError, match="'bogus'"):
        bench.recipe_algorithm({"bogus": 1})
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        bench.parse_set("epochs")
