"""The dashboard's views of runs this coordinator process did not run (stored ones)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from thrift_trainer.coordinator.run import CoordinatorSettings
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.dashboard.views import Views


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class StoredOnly:
    """A coordinator that holds no live run: the dashboard reads its store alone."""

    store: RunStore
    settings: CoordinatorSettings
    runs: list = field(default_factory=list)

    def live_runs(self) -> list:
        return self.runs


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coordinator(tmp_path: Path, clock: Clock) -> Iterator[StoredOnly]:
    settings = CoordinatorSettings(data_root=tmp_path, run_root=tmp_path, policy=2,
                                   suspect_seconds=3.0, dead_seconds=10.0)
    with RunStore(tmp_path / "runs.db", clock=clock) as store:
        yield StoredOnly(store, settings)


def test_an_ended_runs_nodes_show_the_state_they_had_when_it_ended(
        coordinator: StoredOnly, clock: Clock) -> None:
    store = coordinator.store
    store.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=1)
    for node in ("127.0.0.1:9091", "127.0.0.1:9092"):
        store.node_answer("r1", node, "completed", False, samples=20)
    clock.now += 5.0  # 9091 falls silent; 9092's heartbeats go on
    store.node_heartbeats("r1", {"127.0.0.1:9092": clock.now})
    clock.now += 1.0
    store.end_run("r1", "completed")
    clock.now += 3600.0  # read long after: the state is the one at the end, not now
    nodes = Views(coordinator).run("r1")["nodes"]
    assert {n["node"]: n["state"] for n in nodes} == {"127.0.0.1:9091": "suspect",
                                                      "127.0.0.1:9092": "alive"}


def test_the_dashboard_page_gives_the_address_of_every_page_and_api():
    """docs/dashboard.md named no run page's address: each route is given there."""
    import re

    from devtools.local_cluster import REPO

    source = (REPO / "dashboard" / "app.py").read_text(encoding="utf-8")
    routes = re.findall(r'Route\("(/[^"]*)"', source)
    assert "/runs/{run_id}" in routes
    doc = (REPO / "docs" / "dashboard.md").read_text(encoding="utf-8")
    missing = [r for r in routes if r not in ("/", "/login")
               and re.sub(r"\{(\w+)(:\w+)?\}", r"<\1>", r) not in doc]
    assert missing == [], f"docs/dashboard.md does not give {missing}"
