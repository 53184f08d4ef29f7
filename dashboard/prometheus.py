"""Prometheus metrics of the coordinator, read from its state on each scrape.

`CoordinatorCollector` turns the dashboard's views (live runs' progress and nodes, the run
store's unit ledger, the last metrics row) and the process's wire counters
(`wire.stats.WIRE_STATS`) into metric families when /metrics is scraped; nothing is
counted in advance except the served RPCs' latencies, which `TimedHandler` observes
into a histogram as each call returns.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from thrift_trainer.coordinator.run_store import RunStoreError
from thrift_trainer.dashboard import run_files
from thrift_trainer.dashboard.views import Views
from thrift_trainer.wire.stats import WIRE_STATS, WireStats

RUNS_EXPORTED = 20  # the newest runs of this process get per-run series
NODE_OUTCOMES = ("accepted", "rejected", "delayed", "failed", "cancelled")
RUN_STATES = ("running", "completed", "failed", "cancelled")
NODE_STATES = ("alive", "suspect", "dead")
# Served calls range from a ping (ms) to a whole run (train blocks until its end).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
                   1800.0, 7200.0)


def registry_for(views: Views, latency: Histogram | None = None,
                 wire: WireStats = WIRE_STATS) -> CollectorRegistry:
    """A registry of this coordinator's collector, the process's own metrics and, when
    given, the RPC latency histogram."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(CoordinatorCollector(views, wire))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if latency is not None:
        registry.register(latency)
    return registry


def latency_histogram() -> Histogram:
    return Histogram("trainer_rpc_seconds", "Time to answer a call of the Coordinator service",
                     ["method"], buckets=LATENCY_BUCKETS, registry=None)


class TimedHandler:
    """A service handler whose public methods observe their duration into `histogram`,
    labelled by method (exceptions included: a refused call is a call answered)."""

    def __init__(self, handler: Any, histogram: Histogram) -> None:
        self._handler = handler
        self._histogram = histogram

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handler, name)
        if name.startswith("_") or not callable(attr):
            return attr
        return self._timed(name, attr)

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        child = self._histogram.labels(method=name)

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                child.observe(time.perf_counter() - started)
        return timed


class CoordinatorCollector(Collector):
    """Runs, units, nodes and wire bytes of the coordinator, as of the scrape."""

    def __init__(self, views: Views, wire: WireStats = WIRE_STATS) -> None:
        self.views = views
        self.wire = wire

    def collect(self) -> Iterator[Metric]:
        runs = self.views.coordinator.live_runs()[:RUNS_EXPORTED]
        yield from _run_metrics(self.views, runs)
        yield from _node_metrics(runs)
        yield from _wire_metrics(self.wire.snapshot())


def _run_metrics(views: Views, runs: list[Any]) -> Iterator[Metric]:
    state = GaugeMetricFamily("trainer_run_state", "1 for the run's current state",
                              labels=["run", "state"])
    round_ = GaugeMetricFamily("trainer_run_round", "Rounds done", labels=["run"])
    rounds = GaugeMetricFamily("trainer_run_rounds", "Rounds asked for", labels=["run"])
    counts = {name: CounterMetricFamily(f"trainer_run_{name}", help_, labels=["run"])
              for name, help_ in (("rejected", "Units rejected by nodes"),
                                  ("failed", "Unit attempts that failed"),
                                  ("stale", "Unit attempts reclaimed past their deadline"),
                                  ("cancelled", "Unit attempts cancelled"),
                                  ("discarded", "Units given up after too many failures "
                                                "(their rounds went on without them)"),
                                  ("units_done", "Units completed"))}
    in_flight = GaugeMetricFamily("trainer_run_in_flight", "Units out on nodes", labels=["run"])
    units = GaugeMetricFamily("trainer_run_units", "Units of the run by ledger status",
                              labels=["run", "status"])
    latest = GaugeMetricFamily("trainer_run_metric", "Latest value of each per-round metric",
                               labels=["run", "metric"])
    payload = CounterMetricFamily("trainer_run_payload_bytes",
                                  "Bytes of the run's training calls", labels=["run", "direction"])
    for run in runs:
        snap = run.progress.snapshot()
        rid = run.run_id
        for name in RUN_STATES:
            state.add_metric([rid, name], 1.0 if snap.state == name else 0.0)
        round_.add_metric([rid], snap.round)
        rounds.add_metric([rid], snap.rounds)
        in_flight.add_metric([rid], snap.in_flight)
        for name, family in counts.items():
            family.add_metric([rid], getattr(snap, name))
        for status, n in _ledger(views, rid).items():
            units.add_metric([rid, status], n)
        for name, value in _latest(views, rid, snap).items():
            latest.add_metric([rid, name], value)
        down, up = run.payload_totals()
        payload.add_metric([rid, "down"], down)
        payload.add_metric([rid, "up"], up)
    yield from (state, round_, rounds, in_flight, *counts.values(), units, latest, payload)


def _ledger(views: Views, run_id: str) -> dict[str, int]:
    try:
        return views.cached(("ledger", run_id),
                            lambda: views.coordinator.store.ledger_counts(run_id))
    except RunStoreError:
        return {}


def _latest(views: Views, run_id: str, snap: Any) -> dict[str, float]:
    """The last metrics row's numbers (IS, FID, losses, bytes), and the live progress's."""
    row = views.cached(("last_row", run_id),
                       lambda: run_files.last_metrics_row(views.run_dir(run_id))) or {}
    values = {k: float(v) for k, v in row.items()
              if k not in ("round", "discarded") and isinstance(v, (int, float))
              and not isinstance(v, bool)}
    # a run with clients: the latest round's figures and its latest federated evaluation's
    values.update({k: float(v) for k, v in (snap.clients or {}).items()})
    if snap.validation_error >= 0:
        values["validation_error"] = snap.validation_error
    if snap.train_loss is not None:
        values["train_loss"] = snap.train_loss
    return values


def _node_metrics(runs: list[Any]) -> Iterator[Metric]:
    """Per node, summed over the runs of this process (so counters only grow); the state
    and timings of a node are those of the newest run that has it."""
    units = CounterMetricFamily("trainer_node_units", "Units a node answered, by outcome",
                                labels=["node", "outcome"])
    state = GaugeMetricFamily("trainer_node_state", "1 for the node's current state",
                              labels=["node", "state"])
    silent = GaugeMetricFamily("trainer_node_silent_seconds", "Since the node was last heard",
                               labels=["node"])
    unit_time = GaugeMetricFamily("trainer_node_unit_seconds",
                                  "The node's typical undelayed unit time", labels=["node"])
    pull = GaugeMetricFamily("trainer_node_pull", "1 for a pull node", labels=["node"])
    by_state = GaugeMetricFamily("trainer_nodes", "Nodes of the newest run by state",
                                 labels=["state"])
    totals: dict[str, dict[str, int]] = {}
    seen: set[str] = set()
    for i, run in enumerate(runs):
        for handle in list(run.nodes):
            s = handle.summary()
            counts = totals.setdefault(s.node, dict.fromkeys(NODE_OUTCOMES, 0))
            for outcome in NODE_OUTCOMES:
                counts[outcome] += getattr(s, outcome)
            if s.node in seen:
                continue
            seen.add(s.node)
            for name in NODE_STATES:
                state.add_metric([s.node, name], 1.0 if s.state == name else 0.0)
            silent.add_metric([s.node], s.silent_seconds)
            pull.add_metric([s.node], 1.0 if s.pull else 0.0)
            if (seconds := handle.unit_seconds()) is not None:
                unit_time.add_metric([s.node], seconds)
        if i == 0:
            newest = [h.summary().state for h in list(run.nodes)]
            for name in NODE_STATES:
                by_state.add_metric([name], newest.count(name))
    for node, counts in totals.items():
        for outcome, n in counts.items():
            units.add_metric([node, outcome], n)
    yield from (units, state, silent, unit_time, pull, by_state)


def _wire_metrics(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """The process's transport counters by Thrift method and message kind."""
    wire_bytes = CounterMetricFamily("trainer_wire_bytes", "Bytes on the wire (frames)",
                                     labels=["method", "kind", "direction"])
    frames = CounterMetricFamily("trainer_wire_frames", "Frames on the wire",
                                 labels=["method", "kind", "direction"])
    for label, counts in snapshot["by_method"].items():
        method, _, kind = label.partition(" ")
        for direction in ("sent", "received"):
            if not counts[f"{direction}_frames"]:  # a call is only received, its reply sent
                continue
            wire_bytes.add_metric([method, kind or "?", direction], counts[f"{direction}_bytes"])
            frames.add_metric([method, kind or "?", direction], counts[f"{direction}_frames"])
    yield from (wire_bytes, frames)
