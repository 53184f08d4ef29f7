"""The Coordinator Thrift service: starts runs, reports their progress, cancels them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.nodes_file import NodesFileError, read_nodes_file
from coordinator.run import CoordinatorSettings, Run
from coordinator.run_store import RunStore, UnfinishedUnit
from wire.generated import PROTOCOL_VERSION, ttypes
from wire.version import check_protocol_version

log = logging.getLogger("coordinator")
SHUTDOWN_SECONDS = 10.0  # how long a shutdown waits for cancelled runs to answer


class CoordinatorHandler:
    """Implements Coordinator.Iface. `train` blocks for the whole run; the other calls
    answer at once from the run's live progress, on other connections."""

    def __init__(self, nodes_file: Path, settings: CoordinatorSettings) -> None:
        self.nodes_file = nodes_file
        self.settings = settings
        self.store = open_store(settings)
        interrupted = self.store.fail_unfinished_runs("the coordinator stopped during the run")
        if interrupted:
            log.warning("runs interrupted by an earlier stop: %s", ", ".join(interrupted))
        self._runs: dict[str, Run] = {}
        self._order: list[str] = []
        self._lock = threading.Lock()

    def train(self, request: ttypes.TrainRequest) -> ttypes.RunResult:
        check_protocol_version(request.protocol_version, "coordinator")
        try:
            # Read on every run, so an edited nodes file applies without a restart.
            nodes = read_nodes_file(self.nodes_file)
        except NodesFileError as exc:
            raise ttypes.TrainingFailed(message=str(exc), nodes_tried=[]) from None
        run = Run(request, nodes, self.settings, self.store,
                  nodes_source=lambda: read_nodes_file(self.nodes_file))
        with self._lock:
            if run.run_id in self._runs:
                raise ttypes.InvalidRequest(message=f"run id {run.run_id!r} is already used")
            run.register()
            self._runs[run.run_id] = run
            self._order.append(run.run_id)
        return run.execute()

    def status(self, request: ttypes.StatusRequest) -> ttypes.RunStatus:
        status = self._find(request.run_id).progress.snapshot()
        status.unfinished = [_unit_info(u) for u in self.store.unfinished_units(status.run_id)]
        status.ledger = self.store.ledger_counts(status.run_id)
        return status

    def cancel(self, request: ttypes.CancelRunRequest) -> ttypes.CancelRunResult:
        run = self._find(request.run_id)
        cancelled = run.cancel()
        if cancelled:
            log.info("run %s: cancel requested", run.run_id)
        return ttypes.CancelRunResult(cancelled=cancelled)

    def list_runs(self, request: ttypes.ListRunsRequest) -> ttypes.ListRunsResult:
        with self._lock:
            ids = list(reversed(self._order))
        if request.limit:
            ids = ids[: request.limit]
        return ttypes.ListRunsResult(runs=[self._runs[i].progress.snapshot() for i in ids])

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        check_protocol_version(request.protocol_version, "coordinator")
        with self._lock:
            running = sum(1 for r in self._runs.values() if r.progress.state == "running")
        return ttypes.NodeInfo(protocol_version=PROTOCOL_VERSION, node_id="coordinator",
                               load_prob=0.0, units_running=running, units_completed=0,
                               units_rejected=0, uptime_seconds=0.0)

    def shutdown(self, then: Callable[[], None], timeout: float = SHUTDOWN_SECONDS) -> None:
        """Cancel every running run, give them `timeout` seconds to tell their clients,
        then call `then` (stopping the server). Returns at once: safe in a signal handler."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.cancel("the coordinator is shutting down")

        def wait_then_stop() -> None:
            deadline = time.monotonic() + timeout
            for run in runs:
                run.finished.wait(max(0.0, deadline - time.monotonic()))
            then()
            self.store.close()

        threading.Thread(target=wait_then_stop, name="shutdown", daemon=True).start()

    def _find(self, run_id: str) -> Run:
        with self._lock:
            if not run_id and self._order:
                run_id = self._order[-1]
            run = self._runs.get(run_id)
        if run is None:
            raise ttypes.UnknownRun(message=f"no run {run_id!r} on this coordinator")
        return run


def open_store(settings: CoordinatorSettings) -> RunStore:
    """The run store of these settings, its folder created if needed."""
    path = settings.store_path or settings.run_root / "runs.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return RunStore(path)


def _unit_info(unit: UnfinishedUnit) -> ttypes.UnitInfo:
    return ttypes.UnitInfo(round=unit.round, unit_id=unit.unit_id, status=unit.status,
                           node=unit.node, age_seconds=unit.age_seconds, attempts=unit.attempts,
                           failures=unit.failures, last_reason=unit.last_reason)
