"""The Coordinator Thrift service: starts runs, reports their progress, cancels them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.records import InvalidRun, RunFailed, RunStopped
from coordinator.run import CoordinatorSettings, Run
from coordinator.run_store import RunRecord, RunStore, RunStoreError, UnfinishedUnit
from coordinator.status_wire import run_request, run_result, run_status, service_errors
from coordinator.store_lock import StoreLock
from coordinator.stored_status import stored_status
from engine.nodes.membership import Membership
from engine.nodes.membership_service import MembershipService
from engine.nodes.nodes_file import NodeAddress, NodesFile, NodesFileError, NoNodesListed
from engine.records import RunSnapshot
from wire.generated import PROTOCOL_VERSION, ttypes
from wire.version import COORDINATOR_ID, check_protocol_version

log = logging.getLogger("coordinator")
SHUTDOWN_SECONDS = 10.0  # how long a shutdown waits for cancelled runs to answer


class CoordinatorHandler(MembershipService):
    """Implements Coordinator.Iface. `train` blocks for the whole run; the other calls
    answer at once from the run's live progress, on other connections."""

    def __init__(self, nodes_file: Path, settings: CoordinatorSettings) -> None:
        self.nodes_file = NodesFile(nodes_file)
        self.settings = settings
        self.lock, self.store = open_store(settings)
        interrupted = self.store.fail_unfinished_runs("the coordinator stopped during the run")
        if interrupted:
            log.warning("runs interrupted by an earlier stop: %s", ", ".join(interrupted))
        self.membership = Membership(settings.heartbeat_seconds, settings.suspect_seconds,
                                     settings.dead_seconds)
        self._runs: dict[str, Run] = {}
        self._order: list[str] = []
        self._lock = threading.Lock()

    def train(self, request: ttypes.TrainRequest) -> ttypes.RunResult:
        check_protocol_version(request.protocol_version, "coordinator")
        try:
            nodes = self.file_nodes()
        except NodesFileError as exc:
            raise ttypes.TrainingFailed(message=str(exc), nodes_tried=[]) from None
        with service_errors():
            run = Run(run_request(request), nodes, self.settings, self.store,
                      nodes_source=self.file_nodes, membership=self.membership)
            self._add(run)
            result = run_result(run.execute())
        result.final_status = self._with_ledger(run_status(run.progress.snapshot()))
        return result

    def file_nodes(self) -> list[NodeAddress]:
        """The nodes file, read on every run and round so edits apply without a restart.
        A missing or empty file means registered nodes only; so does a malformed one while
        nodes are registered."""
        try:
            return self.nodes_file.read()
        except NoNodesListed:
            return []
        except NodesFileError:
            if self.membership.members():
                return []
            raise

    def resume(self, run_id: str, rounds: int | None = None) -> Run:
        """Continue run `run_id` from its last checkpoint (to ``rounds`` in all when that
        extends it), in a thread of its own; clients follow it with status. Raises
        CheckpointError, NodesFileError or InvalidRun."""
        run = Run.resume(run_id, self.file_nodes(), self.settings, self.store,
                         nodes_source=self.file_nodes, membership=self.membership,
                         rounds=rounds)
        self._add(run)
        threading.Thread(target=_execute_quietly, args=(run,), name=f"resumed-{run_id}",
                         daemon=True).start()
        return run

    def _add(self, run: Run) -> None:
        with self._lock:
            if run.run_id in self._runs:
                raise InvalidRun(f"run id {run.run_id!r} is already used")
            run.register()
            self._runs[run.run_id] = run
            self._order.append(run.run_id)

    def live_runs(self) -> list[Run]:
        """The runs of this process, the newest first (read by the dashboard)."""
        with self._lock:
            return [self._runs[i] for i in reversed(self._order)]

    def status(self, request: ttypes.StatusRequest) -> ttypes.RunStatus:
        """A run of this process from its live progress, an earlier one from the store;
        without a run id, the latest run."""
        run = self._live(request.run_id)
        snapshot = run.progress.snapshot() if run is not None else self._stored(request.run_id)
        return self._with_ledger(run_status(snapshot))

    def _with_ledger(self, status: ttypes.RunStatus) -> ttypes.RunStatus:
        """``status`` with the store's unit ledger and unfinished units: what `status` and
        the final summary report, from the same records."""
        try:
            status.unfinished = [_unit_info(u)
                                 for u in self.store.unfinished_units(status.run_id)]
            status.ledger = self.store.ledger_counts(status.run_id)
        except RunStoreError as exc:  # the progress still answers; the run reports the fault
            log.warning("status of run %s without the store: %s", status.run_id, exc)
        return status

    def cancel(self, request: ttypes.CancelRunRequest) -> ttypes.CancelRunResult:
        run = self._live(request.run_id)
        if run is None:  # a stored run of an earlier process has ended (or is unknown)
            self._stored(request.run_id)
            return ttypes.CancelRunResult(cancelled=False)
        cancelled = run.cancel()
        if cancelled:
            log.info("run %s: cancel requested", run.run_id)
        return ttypes.CancelRunResult(cancelled=cancelled)

    def list_runs(self, request: ttypes.ListRunsRequest) -> ttypes.ListRunsResult:
        """Runs of this process live, then the store's earlier ones (before a restart)."""
        limit = request.limit or 50
        runs = [run_status(run.progress.snapshot()) for run in self.live_runs()[:limit]]
        known = {r.run_id for r in runs}
        for record in self.store.list_runs(limit):
            if len(runs) < limit and record.run_id not in known:
                runs.append(run_status(self._stored_snapshot(record)))
        return ttypes.ListRunsResult(runs=runs)

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        check_protocol_version(request.protocol_version, "coordinator")
        with self._lock:
            running = sum(1 for r in self._runs.values() if r.progress.state == "running")
        return ttypes.NodeInfo(protocol_version=PROTOCOL_VERSION, node_id=COORDINATOR_ID,
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
            self.close()

        threading.Thread(target=wait_then_stop, name="shutdown", daemon=True).start()

    def close(self) -> None:
        """Close the store and give up its lock, for another coordinator to take."""
        self.store.close()
        self.lock.release()

    def _live(self, run_id: str) -> Run | None:
        """The run of this process with that id (without one: its latest), or None."""
        with self._lock:
            if not run_id and self._order:
                run_id = self._order[-1]
            return self._runs.get(run_id)

    def _stored_snapshot(self, record: RunRecord) -> RunSnapshot:
        return stored_status(self.store, record, self.settings.suspect_seconds,
                             self.settings.dead_seconds)

    def _stored(self, run_id: str) -> RunSnapshot:
        """The status of a run the store holds (without a run id: its latest run)."""
        try:
            if run_id:
                record = self.store.get_run(run_id)
            else:
                record = next(iter(self.store.list_runs(1)), None)
            if record is not None:
                return self._stored_snapshot(record)
        except RunStoreError as exc:
            raise ttypes.UnknownRun(message=f"run {run_id!r}: the run store cannot be "
                                            f"read: {exc}") from None
        if not run_id:
            raise ttypes.UnknownRun(message="this coordinator has no runs yet")
        raise ttypes.UnknownRun(message=f"no run {run_id!r} on this coordinator")


def _execute_quietly(run: Run) -> None:
    """A resumed run has no train() caller to raise to: its end goes to the log and the
    store, where status and runs show it."""
    try:
        run.execute()
    except (RunFailed, RunStopped) as exc:
        log.warning("resumed run %s ended: %s", run.run_id, exc)


def open_store(settings: CoordinatorSettings) -> tuple[StoreLock, RunStore]:
    """The run store of these settings, its folder created if needed, locked for this
    process first: a second coordinator on the same store is refused with StoreInUse
    before it can touch the first one's runs."""
    path = settings.store_path or settings.run_root / "runs.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = StoreLock(path)
    try:
        return lock, RunStore(path)
    except BaseException:
        lock.release()
        raise


def _unit_info(unit: UnfinishedUnit) -> ttypes.UnitInfo:
    return ttypes.UnitInfo(round=unit.round, unit_id=unit.unit_id, status=unit.status,
                           node=unit.node, age_seconds=unit.age_seconds, attempts=unit.attempts,
                           failures=unit.failures, last_reason=unit.last_reason)
