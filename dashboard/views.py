"""The dashboard's data: runs, a run's rounds, nodes and unfinished units, as JSON-ready dicts.

Everything is read from what the coordinator already keeps: each live run's progress
snapshot and node handles, the run store (runs from before a restart too) and the run's
folder (metrics rows, sample grids). Reads are cached for `ttl` seconds, so any number of
open pages and scrapes costs the coordinator at most one read of each view per period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from thrift_trainer.coordinator.client_files import per_client, read_clients
from thrift_trainer.coordinator.run import RUN_ID, CoordinatorSettings, Run
from thrift_trainer.coordinator.store_protocol import LedgerQueries
from thrift_trainer.coordinator.store_records import RunRecord, RunStoreError
from thrift_trainer.coordinator.stored_status import stored_status
from thrift_trainer.dashboard import run_files
from thrift_trainer.engine.records import RunSnapshot

MAX_RUNS = 200  # runs listed on the runs page
CORE_ROUND_KEYS = ("round", "validation_error", "validation_loss", "train_loss", "seconds",
                   "discarded")


class Coordinator(Protocol):
    """What the dashboard reads of the coordinator (coordinator.handler.CoordinatorHandler)."""

    store: LedgerQueries
    settings: CoordinatorSettings

    def live_runs(self) -> list[Run]: ...


class UnknownRunError(LookupError):
    """No run of that id, live or stored."""


class Views:
    """Cached reads of the coordinator's state for pages, the JSON API and /metrics."""

    def __init__(self, coordinator: Coordinator, ttl: float = 0.5) -> None:
        self.coordinator = coordinator
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._ended_rows: dict[str, dict[str, Any]] = {}  # last metrics rows of ended runs

    def cached(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`'s value, computed at most once per `ttl` seconds for each key.
        Computed outside the lock: a slow read never holds up other views."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = compute()
        with self._lock:
            self._cache[key] = (time.monotonic(), value)
            if len(self._cache) > 4 * MAX_RUNS:  # pages of many old runs were opened
                self._cache = {k: v for k, v in self._cache.items()
                               if now - v[0] < self.ttl}
        return value

    # ------------------------------------------------------------ leadership
    def leadership(self) -> dict[str, str]:
        """Coordinators sharing a PostgreSQL store: who leads, in words ({} otherwise)."""
        if getattr(self.coordinator, "keeper", None) is None:
            return {}
        return {"leader": self.cached("leader", self.coordinator.leader_line)}

    # ------------------------------------------------------------------ runs
    def runs(self) -> list[dict[str, Any]]:
        return self.cached("runs", self._runs)

    def _runs(self) -> list[dict[str, Any]]:
        live = {run.run_id: run for run in self.coordinator.live_runs()}
        try:
            stored = self.coordinator.store.list_runs(MAX_RUNS)
        except RunStoreError:
            stored = []
        records = {r.run_id: r for r in stored}
        order = list(live) + [r.run_id for r in stored if r.run_id not in live]
        return [self._summary(run_id, live.get(run_id), records.get(run_id))
                for run_id in order[:MAX_RUNS]]

    def _summary(self, run_id: str, run: Run | None, record: RunRecord | None
                 ) -> dict[str, Any]:
        state = run.progress.state if run is not None else getattr(record, "state", None)
        last = self._last_row(run_id, ended=state not in (None, "running"))
        summary: dict[str, Any] = {
            "run_id": run_id, "live": run is not None,
            "final": {k: v for k, v in last.items() if k not in ("round", "discarded")},
        }
        if record is not None:
            summary.update(state=record.state, algorithm=record.algorithm, model=record.model,
                           dataset=record.dataset, round=record.rounds_done,
                           rounds=record.rounds, started=record.created,
                           wall_seconds=(record.ended or time.time()) - record.created,
                           message=record.message)
        if run is not None:
            snap = run.progress.snapshot()
            request = run.request
            summary.update(state=snap.state, algorithm=request.algorithm, model=request.model,
                           dataset=request.dataset, round=snap.round, rounds=snap.rounds,
                           wall_seconds=snap.elapsed_seconds, message=snap.message)
            summary.setdefault("started", time.time() - snap.elapsed_seconds)
        return summary

    def _last_row(self, run_id: str, ended: bool) -> dict[str, Any]:
        """The run's last metrics row; kept once the run has ended, since its file no
        longer changes (so a long list of old runs is read once, not every period)."""
        with self._lock:  # a run resumed after it failed writes again: forget its row
            kept = self._ended_rows.get(run_id) if ended else self._ended_rows.pop(run_id, None)
        if ended and kept is not None:
            return kept
        row = run_files.last_metrics_row(self.run_dir(run_id)) or {}
        if ended:
            with self._lock:
                self._ended_rows[run_id] = row
        return row

    # ------------------------------------------------------------------- one run
    def run(self, run_id: str) -> dict[str, Any]:
        """Everything the run page shows; UnknownRunError if there is no such run."""
        if not RUN_ID.match(run_id):
            raise UnknownRunError(run_id)
        return self.cached(("run", run_id), lambda: self._run(run_id))

    def _run(self, run_id: str) -> dict[str, Any]:
        run = self.live_run(run_id)
        store = self.coordinator.store
        try:
            record = store.get_run(run_id)
        except RunStoreError:
            record = None
        if run is None and record is None:
            raise UnknownRunError(run_id)
        view = {"summary": self._summary(run_id, run, record),
                "progress": _progress(run),
                "rounds": self._rounds(run_id),
                "nodes": self._nodes(run_id, run),
                "clients": per_client(read_clients(self.run_dir(run_id))),
                "samples": run_files.sample_rounds(self.run_dir(run_id))}
        try:
            view["unfinished"] = [asdict(u) for u in store.unfinished_units(run_id)]
            view["ledger"] = store.ledger_counts(run_id)
        except RunStoreError:
            view["unfinished"], view["ledger"] = [], {}
        if record is not None:
            view["summary"]["config"] = record.config
            view["summary"]["policy"] = record.policy
        return view

    def live_run(self, run_id: str) -> Run | None:
        return next((r for r in self.coordinator.live_runs() if r.run_id == run_id), None)

    def run_dir(self, run_id: str) -> Path:
        return self.coordinator.settings.run_root / run_id

    def _rounds(self, run_id: str) -> dict[str, list[Any]]:
        """Per-round series by metric name, all of one length (None where a round has
        no value): the store's rounds, with the metrics file's scores and bytes."""
        try:
            stored = {r.round: r for r in self.coordinator.store.list_rounds(run_id)}
        except RunStoreError:
            stored = {}
        rows = {row["round"]: row for row in run_files.metrics_rows(self.run_dir(run_id))}
        rounds = sorted(set(stored) | set(rows))
        names = list(dict.fromkeys(k for row in rows.values() for k in row
                                   if k not in CORE_ROUND_KEYS))
        series: dict[str, list[Any]] = {"round": rounds}
        for name in ("validation_error", "validation_loss", "train_loss", "seconds"):
            series[name] = [_pick(stored.get(r), rows.get(r), name) for r in rounds]
        series["units_per_second"] = [_units_per_second(stored.get(r)) for r in rounds]
        for name in names:
            series[name] = [rows.get(r, {}).get(name) for r in rounds]
        return series

    def _nodes(self, run_id: str, run: Run | None) -> list[dict[str, Any]]:
        """A running run's nodes as its handles see them; once it has ended, its nodes are
        no longer watched, so the store's counts and last heartbeats, each node's state
        when the run ended (as `status` shows it), and its unit time and kind while this
        process still holds them."""
        if run is not None and run.progress.state == "running":
            return _live_nodes(run)
        nodes = self._stored_nodes(run_id)
        ends = self._ends(run_id, run)
        for node in nodes:
            node["state"], node["note"] = ends.get(node["node"], ("unknown", None))
        if run is not None:
            handles = {n["node"]: n for n in _live_nodes(run)}
            for node in nodes:
                live = handles.get(node["node"], {})
                node.update(unit_seconds=live.get("unit_seconds"), pull=live.get("pull"),
                            in_flight=live.get("in_flight"))
        return nodes

    def _ends(self, run_id: str, run: Run | None) -> dict[str, tuple[str, str | None]]:
        """Each node's state when the ended run stopped watching it (as the run kept it
        while this process holds the run, else judged from the store as `status` does),
        and why it was left out of the run, if it was."""
        snapshot = run.progress.snapshot() if run is not None else self._stored_status(run_id)
        return {n.node: (n.state, n.note) for n in snapshot.nodes} \
            if snapshot is not None else {}

    def _stored_status(self, run_id: str) -> RunSnapshot | None:
        store, settings = self.coordinator.store, self.coordinator.settings
        try:
            record = store.get_run(run_id)
            return None if record is None else stored_status(
                store, record, settings.suspect_seconds, settings.dead_seconds)
        except RunStoreError:
            return None

    def _stored_nodes(self, run_id: str) -> list[dict[str, Any]]:
        """The store's counts of a run's nodes, without their state."""
        try:
            records = self.coordinator.store.node_stats(run_id)
        except RunStoreError:
            return []
        now = time.time()
        return [{"node": n.node, "accepted": n.accepted, "rejected": n.rejected,
                 "delayed": n.delayed, "failed": n.failed, "cancelled": n.cancelled,
                 "samples": n.samples,
                 "last_heartbeat_seconds": (now - n.last_heartbeat
                                            if n.last_heartbeat else None),
                 "unit_seconds": None, "pull": None} for n in records]


def _progress(run: Run | None) -> dict[str, Any] | None:
    if run is None:
        return None
    snap = asdict(run.progress.snapshot())
    snap.pop("nodes")
    down, up = run.payload_totals()
    snap.update(bytes_down=down, bytes_up=up)
    return snap


def _live_nodes(run: Run) -> list[dict[str, Any]]:
    nodes = []
    for handle in list(run.nodes) + list(run.left_out):
        s = handle.summary()
        nodes.append({"node": s.node, "state": s.state, "accepted": s.accepted,
                      "rejected": s.rejected, "delayed": s.delayed, "failed": s.failed,
                      "cancelled": s.cancelled, "samples": s.samples,
                      "last_heartbeat_seconds": s.silent_seconds,
                      "unit_seconds": handle.unit_seconds(), "pull": s.pull,
                      "in_flight": handle.in_flight, "note": s.note})
    return nodes


def _pick(record: Any, row: dict[str, Any] | None, name: str) -> Any:
    value = getattr(record, name, None) if record is not None else None
    if value is None and row is not None:
        value = row.get(name)
    return value


def _units_per_second(record: Any) -> float | None:
    if record is None or not record.seconds:
        return None
    return record.completed_units / record.seconds
