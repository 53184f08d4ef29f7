"""bench/plugin_overhead.py: the plug-in it names builds the built-in model's very network,
and its summary and report of interleaved runs (no process is started)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from thrift_trainer.training import plugins
from thrift_trainer.training.models import modules
from thrift_trainer.training.models.settings import DataShape

_PATH = Path(__file__).resolve().parents[2] / "bench" / "plugin_overhead.py"
_SPEC = importlib.util.spec_from_file_location("bench_plugin_overhead", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


@pytest.fixture
def allowed() -> Iterator[None]:
    """The bench allowed as the plug-in module its nodes import; forgotten afterwards."""
    path_before = list(sys.path)
    plugins.reset()
    plugins.allow([_PATH.stem], _PATH.parent)
    try:
        yield
    finally:
        plugins.reset()
        sys.path[:] = path_before
        sys.modules.pop(_PATH.stem, None)


def test_the_plugin_builds_the_built_in_network_with_the_same_weights(allowed) -> None:
    shape = DataShape((16,), 26)
    args = {"hidden": [128, 128]}
    built_in = modules.build(bench.BUILT_IN, args, shape, seed=1)
    plugin = modules.build(bench.PLUGIN, args, shape, seed=1)
    assert modules.fingerprint(plugin) == modules.fingerprint(built_in)
    for (name, a), (other, b) in zip(modules.state_arrays(built_in).items(),
                                     modules.state_arrays(plugin).items(), strict=True):
        assert name == other and (a == b).all()


def test_both_runs_get_the_same_config_but_the_model() -> None:
    built_in = bench.client_args(bench.BUILT_IN, 7)
    plugin = bench.client_args(bench.PLUGIN, 7)
    differ = [(a, b) for a, b in zip(built_in, plugin, strict=True) if a != b]
    assert differ == [(f"run.model={bench.BUILT_IN}", f"run.model={bench.PLUGIN}")]
    assert "run.rounds=7" in built_in and str(bench.CONFIG) in built_in


def test_the_summary_compares_medians_and_pairs() -> None:
    times = {bench.BUILT_IN: [1.0, 2.0, 1.2], bench.PLUGIN: [1.1, 1.8, 1.2]}
    errors = {bench.BUILT_IN: [0.5, 0.5, 0.5], bench.PLUGIN: [0.5, 0.5, 0.5]}
    walls = {bench.BUILT_IN: [3.0, 3.5, 3.2], bench.PLUGIN: [3.1, 3.4, 3.3]}
    figures = bench.summary(times, errors, walls)
    assert figures["ratio_of_medians"] == pytest.approx(1.0)
    assert figures["pair_ratios"] == pytest.approx([1.1, 0.9, 1.0])
    assert figures["same_validation_error"]
    text = bench.report(figures, 7)
    assert "3 interleaved pairs of 7-round runs" in text
    assert "ratio of the medians: **1.000**" in text and "range 0.900-1.100" in text
    assert "same validation error in every pair: yes" in text
    assert f"`{bench.BUILT_IN}` 3.20, `{bench.PLUGIN}` 3.30" in text
    errors[bench.PLUGIN][1] = 0.4
    assert "every pair: NO" in bench.report(bench.summary(times, errors, walls), 7)
