"""bench/compression.py --codecs: which codecs a run measures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "compression.py"
_SPEC = importlib.util.spec_from_file_location("bench_compression", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_chosen_codecs_run_after_none_in_table_order() -> None:
    chosen = bench.chosen("up topk 1%, warm-up 4; up topk 1%", quick=False)
    assert [label for label, _ in chosen] == ["none", "up topk 1%", "up topk 1%, warm-up 4"]
    assert chosen[2][1] == {"up": "topk", "topk_fraction": 0.01, "topk_warmup_rounds": 4}
    assert [label for label, _ in bench.chosen(None, quick=True)] == [
        "none", "up fp16", "up int8", "up topk 1%"]
    assert len(bench.chosen(None, quick=False)) == len(bench.CODECS)


def test_an_unknown_codec_label_is_named() -> None:
    with pytest.raises(SystemExit, match="'up zip'"):
        bench.chosen("up zip", quick=False)
