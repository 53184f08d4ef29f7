"""bench/clients_scale.py: its arguments, the client's settings, the --clients ranges and
/proc readings it relies on (no process), and its --quick mode through a coordinator and 2
nodes holding half the clients each (processes)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from devtools import federated_cluster

_PATH = Path(__file__).resolve().parents[2] / "bench" / "clients_scale.py"
_SPEC = importlib.util.spec_from_file_location("bench_clients_scale", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_defaults_and_quick() -> None:
    args = bench.parse_args([])
    assert args.counts == [100, 1000, 10000] and args.per_round == 100
    assert args.rounds == 10 and args.out == bench.RESULTS
    quick = bench.parse_args(["--quick"])
    assert quick.counts == [100, 1000] and quick.rounds == 2 and quick.per_round == 20
    assert quick.out is None
    for bad in (["--counts", "1"], ["--counts", "100,100"], ["--counts", "x"],
                ["--rounds", "1"], ["--counts", "50", "--per-round", "60"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_client_sets_and_ranges() -> None:
    sets = bench.client_sets(10000, 100, 10)
    assert {"clients.count=10000", "clients.partition=iid", "clients.per_round=100",
            "run.model=mlp_classifier", "data.format=letters", "run.rounds=10"} <= set(sets)
    assert federated_cluster.client_ranges(100, 2) == ["0-49", "50-99"]
    assert federated_cluster.client_ranges(10000, 2) == ["0-4999", "5000-9999"]
    assert federated_cluster.client_ranges(7, 3) == ["0-1", "2-3", "4-6"]
    with pytest.raises(ValueError):
        federated_cluster.client_ranges(1, 2)
    assert federated_cluster.with_sets(["a.b=1", "c.d=2"]) == ["--set", "a.b=1",
                                                               "--set", "c.d=2"]


def test_this_process_cpu_and_peak_memory_are_read_from_proc() -> None:
    cpu = federated_cluster.cpu_seconds(os.getpid())
    times = os.times()
    assert cpu == pytest.approx(times.user + times.system, abs=0.1)
    resident = federated_cluster.memory_kib(os.getpid(), "VmRSS")  # read first: the peak
    assert federated_cluster.memory_kib(os.getpid()) >= resident > 1000  # read after is >= it


@pytest.mark.processes
@pytest.mark.slow
def test_quick_mode_measures_each_process_for_each_count(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {row["clients"]: row for row in result["runs"]}
    assert set(rows) == {100, 1000}
    for count, row in rows.items():
        assert row["rounds"] == 2 and row["units"] == 40
        assert sum(row["units_per_node"]) == 40
        assert set(row["peak_kib"]) == {"coordinator", "node1", "node2", "client"}
        assert all(kib > 10_000 for kib in row["peak_kib"].values())
        assert row["coordinator_cpu_per_unit_ms"] > 0 and row["round_seconds_median"] > 0
        low, high = row["examples_per_client"]
        assert high - low <= 1 and low * count <= 18000
