"""The Coordinator Thrift service: starts runs, reports their progress, cancels them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from thrift_trainer.coordinator.checkpoint import CheckpointError
from thrift_trainer.coordinator.leadership import Leader, LeaseKeeper
from thrift_trainer.coordinator.records import InvalidRun, RunFailed, RunOutcome, RunStopped
from thrift_trainer.coordinator.run import CoordinatorSettings, Run
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.coordinator.status_wire import (
    run_request,
    run_result,
    run_status,
    service_errors,
)
from thrift_trainer.coordinator.store_lock import StoreLock
from thrift_trainer.coordinator.store_outage import LeadershipLost
from thrift_trainer.coordinator.store_protocol import RunFiles, Store
from thrift_trainer.coordinator.store_records import RunRecord, RunStoreError, UnfinishedUnit
from thrift_trainer.coordinator.stored_status import stored_status
from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.membership_service import MembershipService
from thrift_trainer.engine.nodes.nodes_file import (
    NodeAddress,
    NodesFile,
    NodesFileError,
    NoNodesListed,
)
from thrift_trainer.engine.records import RunSnapshot
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.version import COORDINATOR_ID, STANDBY_ROLE, check_protocol_version

log = logging.getLogger("coordinator")
SHUTDOWN_SECONDS = 10.0  # how long a shutdown waits for cancelled runs to answer


class CoordinatorHandler(MembershipService):
    """Implements Coordinator.Iface. `train` blocks for the whole run; the other calls
    answer at once from the run's live progress, on other connections."""

    def __init__(self, nodes_file: Path, settings: CoordinatorSettings) -> None:
        self.nodes_file = NodesFile(nodes_file)
        self.settings = settings
        self.lock, self.store = open_store(settings)
        # Coordinators sharing a PostgreSQL store: the leader takes interrupted runs up
        self.keeper: LeaseKeeper | None = None  # set by lead_when_elected
        self._leading = self.lock is not None  # on SQLite, this process alone uses the store
        if self._leading:
            interrupted = self.store.fail_unfinished_runs(
                "the coordinator stopped during the run")
            if interrupted:
                log.warning("runs interrupted by an earlier stop: %s", ", ".join(interrupted))
        self.membership = Membership(settings.heartbeat_seconds, settings.suspect_seconds,
                                     settings.dead_seconds)
        self._runs: dict[str, Run] = {}
        self._order: list[str] = []
        # the runs of an earlier lead, cancelled when this coordinator lost it (and
        # whether it ever did): they must have ended before it writes as leader again
        self._former: list[Run] = []
        self._fenced = False
        # resumed runs: the thread of each, and how it ended
        self._resumed: dict[str, threading.Thread] = {}
        self._ends: dict[str, RunOutcome | RunFailed | RunStopped] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ leadership
    def lead_when_elected(self, address: str) -> None:
        """Take part in electing the leader of the PostgreSQL store as ``address`` (what
        clients and the other coordinators are told): lead at once when nobody does, else
        stand by until the lease is free."""
        self.keeper = LeaseKeeper(self.store, address, self._took_lead, self._lost_lead,
                                  self.settings.lease_seconds)
        self.keeper.step()
        self.keeper.start()
        if not self._leading:  # a takeover should not wait for torch to load (1-2 s)
            threading.Thread(target=_load_torch, name="standby-warm-up", daemon=True).start()

    def _took_lead(self, epoch: int) -> None:
        """Carry on every run the store has as running: its leader died or lost the lease.
        Each resumes from its last checkpoint as --resume does, in a thread of its own, so
        that the lease keeper goes on renewing while big checkpoints load; this coordinator
        takes train() calls once they are all resumed."""
        taking = threading.Thread(target=self._take_over, args=(epoch,), name="take-over",
                                  daemon=True)
        taking.start()
        taking.join(self.settings.lease_seconds / 3)  # most takeovers: done by now

    def _take_over(self, epoch: int) -> None:
        if self._fenced and self.keeper is not None:  # it led before: start as a fresh one
            self._await_former_runs()
            self.keeper.store.write_afresh()
        interrupted = self.store.fail_unfinished_runs(f"the leader changed (epoch {epoch})")
        for run_id in interrupted:
            try:
                self.resume(run_id, taken_over=True)
                log.warning("run %s taken over from the previous leader", run_id)
            except (CheckpointError, InvalidRun, NodesFileError, RunStoreError) as exc:
                log.error("run %s cannot be taken over: %s", run_id, exc)
        if self.keeper is not None and self.keeper.epoch == epoch:  # still leading
            self._leading = True

    def _lost_lead(self, leader: Leader) -> None:
        """Stop this process's runs without a write (the store refuses them now); their
        clients are told to follow the new leader, and registered nodes re-register there."""
        self._leading, self._fenced = False, True
        reason = f"this coordinator lost the lead to {leader.address or 'another'}"
        with self._lock:  # from now on the store tells their state, as a standby's do
            former = [self._runs[i] for i in self._order]
            self._runs.clear()
            self._order.clear()
            self._former.extend(former)
        for run in former:
            run.cancel(reason)
        self.membership.forget_all(reason)
        self._await_former_runs()  # (in the lease keeper's thread: no lease taken meanwhile)

    def _await_former_runs(self) -> None:
        """Wait (bounded) for the runs of this coordinator's earlier lead to end: their
        writes, refused under the old epoch, must not be made under a new one."""
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        with self._lock:
            former = list(self._former)
        for run in former:
            run.finished.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._former = [run for run in self._former if not run.finished.is_set()]
            left = [run.run_id for run in self._former]
        if left:
            log.warning("runs of this coordinator's earlier lead have not ended after their "
                        "cancel: %s", ", ".join(left))

    def _leads(self) -> bool:
        """Whether this coordinator leads, as every answer says. A lease confirmed longer
        ago than a renewal interval (a leader woken from a pause, which its keeper has not
        renewed since) is checked against the store's epoch first: a newer leader may hold
        it. Not while the database is away: answers must not wait for it."""
        keeper = self.keeper
        if (not self._leading or keeper is None or keeper.confirmed_lately()
                or self.store.unreachable_since is not None):
            return self._leading
        if keeper.superseded():
            self._leading = False
        return self._leading

    def register_node(self, request: ttypes.RegisterRequest) -> ttypes.RegisterResult:
        """A standby registers nobody: it names the leader (RegisterResult.leader)."""
        if self._leads():
            return super().register_node(request)
        check_protocol_version(request.protocol_version, self.service_name)
        m = self.membership
        return ttypes.RegisterResult(node="", heartbeat_seconds=m.heartbeat_seconds,
                                     suspect_seconds=m.suspect_seconds,
                                     dead_seconds=m.dead_seconds,
                                     leader=self._leader_address() or "")

    @property
    def leading(self) -> bool:
        """Whether this coordinator runs training (always, on SQLite)."""
        return self._leads()

    def leader_line(self) -> str:
        """Who leads the shared store, in words."""
        leading = self._leads()
        leader = self._leader_address()
        epoch = self.keeper.epoch if self.keeper is not None else None
        if leading:
            return f"this coordinator leads the run store (epoch {epoch})"
        return f"{leader} leads" if leader else "no coordinator leads yet"

    def _moved(self, run: Run) -> bool:
        """Whether ``run`` stopped because this coordinator lost the lead. A write refused
        for its epoch may come before the lease keeper's next renewal says so, and so may
        a write cut off when the new leader ended this one's sessions (a lost connection,
        to the run): from then on this coordinator stands by (pings say so), so the caller
        it tells to follow the leader does not come back here."""
        if isinstance(run.ledger.failure, LeadershipLost) or self._superseded():
            self._leading = False
        return not self._leading

    def _superseded(self) -> bool:
        """Whether the store names a newer leader than this coordinator (which may not
        know it yet); False while the database is away (unknown: an answer must not wait
        for it, and the lease keeper steps down if the lease is lost meanwhile)."""
        return (self.keeper is not None and self._leading
                and self.store.unreachable_since is None and self.keeper.superseded())

    def _leader_address(self) -> str | None:
        if self.keeper is None:
            return None
        if self._leading:
            return self.keeper.address
        leader = self.keeper.leader()
        return leader.address if leader is not None and leader.live else ""

    def _not_leading(self, what: str) -> ttypes.TrainingFailed:
        return ttypes.TrainingFailed(
            message=f"{what}: this coordinator stands by ({self.leader_line()})",
            nodes_tried=[], leader=self._leader_address() or "")

    # ---------------------------------------------------------------- service
    def train(self, request: ttypes.TrainRequest) -> ttypes.RunResult:
        check_protocol_version(request.protocol_version, "coordinator")
        if not self._leads():
            raise self._not_leading(f"run {request.run_id} was not started")
        resumed = self._live(request.run_id) if request.run_id else None
        if resumed is not None and resumed.resumed:
            return self._join(resumed, request)
        try:
            nodes = self.file_nodes()
        except NodesFileError as exc:
            raise ttypes.TrainingFailed(message=str(exc), nodes_tried=[]) from None
        with service_errors():
            run = Run(run_request(request), nodes, self.settings, self.store,
                      nodes_source=self.file_nodes, membership=self.membership)
            self._add(run)
        try:
            outcome: RunOutcome | RunFailed | RunStopped = run.execute()
        except (RunFailed, RunStopped) as exc:
            outcome = exc
        return self._answer(run, outcome)

    def _answer(self, run: Run, outcome: RunOutcome | RunFailed | RunStopped
                ) -> ttypes.RunResult:
        """train()'s answer: the result, the run's error, or, when this coordinator lost
        the lead meanwhile, where the run goes on. (Thrift's exceptions are raised
        outside service_errors: a context manager cannot re-raise them.)"""
        if not isinstance(outcome, RunOutcome) and self._moved(run):
            raise self._not_leading(f"run {run.run_id} moved")
        with service_errors():
            if not isinstance(outcome, RunOutcome):
                raise outcome
            result = run_result(outcome)
        result.final_status = self._with_ledger(run_status(run.progress.snapshot()))
        return result

    def _join(self, run: Run, request: ttypes.TrainRequest) -> ttypes.RunResult:
        """The caller of a resumed run (one this coordinator took over, back after its
        leader died): the same request gets the run's result once it ends, as if nothing
        happened."""
        if run_request(request) != replace(run.request, rounds=request.rounds):
            raise ttypes.InvalidRequest(message=f"run id {run.run_id!r} is used by another "
                                                "run (its request differs)")
        self._resumed[run.run_id].join()
        return self._answer(run, self._ends[run.run_id])

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

    def resume(self, run_id: str, rounds: int | None = None, taken_over: bool = False) -> Run:
        """Continue run `run_id` from its last checkpoint (to ``rounds`` in all when that
        extends it), in a thread of its own; clients follow it with status, or call train
        again with the same request (``taken_over``: from a leader that died). Raises
        CheckpointError, NodesFileError, InvalidRun or RunStoreError."""
        if isinstance(self.store, RunFiles):  # the files may be on another machine's disk only
            self.store.restore_files(run_id, self.settings.run_root / run_id)
        run = Run.resume(run_id, self.file_nodes(), self.settings, self.store,
                         nodes_source=self.file_nodes, membership=self.membership,
                         rounds=rounds)
        self._add(run, replaces_ended=taken_over)
        thread = threading.Thread(target=self._execute_resumed, args=(run,),
                                  name=f"resumed-{run_id}", daemon=True)
        self._resumed[run_id] = thread
        thread.start()
        return run

    def _execute_resumed(self, run: Run) -> None:
        """A resumed run has no train() caller to raise to: its end goes to the log and
        the store, where status and runs show it, and to a caller that joins it."""
        try:
            self._ends[run.run_id] = run.execute()
        except (RunFailed, RunStopped) as exc:
            self._ends[run.run_id] = exc
            log.warning("resumed run %s ended: %s", run.run_id, exc)

    def _add(self, run: Run, replaces_ended: bool = False) -> None:
        """``replaces_ended``: a run this process ran before it lost the lead, now taken
        up again, replaces its ended self."""
        with self._lock:
            earlier = self._runs.get(run.run_id)
            if earlier is not None and replaces_ended and earlier.finished.is_set():
                self._order.remove(run.run_id)
                del self._runs[run.run_id]
            elif earlier is not None:
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
        without a run id, the latest run. A coordinator that does not lead answers from the
        store alone: its runs, if any, are stale."""
        run = self._live(request.run_id) if self._leads() else None
        snapshot = run.progress.snapshot() if run is not None else self._stored(request.run_id)
        status = self._with_ledger(run_status(snapshot))
        status.leader = self._leader_address()
        return status

    def _with_ledger(self, status: ttypes.RunStatus) -> ttypes.RunStatus:
        """``status`` with the store's unit ledger and unfinished units: what `status` and
        the final summary report, from the same records. While the store's database is
        away, without them, and a running run says it is paused."""
        away = self.store.unreachable_since
        if away is not None:
            if status.state == "running":
                status.message = (f"paused: the run store cannot be reached (for "
                                  f"{time.monotonic() - away:.0f} s); training goes on when "
                                  f"it is back (the run fails after --store-outage "
                                  f"{self.settings.store_outage:g} s)")
            return status
        try:
            status.unfinished = [_unit_info(u)
                                 for u in self.store.unfinished_units(status.run_id)]
            status.ledger = self.store.ledger_counts(status.run_id)
        except RunStoreError as exc:  # the progress still answers; the run reports the fault
            log.warning("status of run %s without the store: %s", status.run_id, exc)
        return status

    def cancel(self, request: ttypes.CancelRunRequest) -> ttypes.CancelRunResult:
        run = self._live(request.run_id) if self._leads() else None
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
        live = self.live_runs() if self._leads() else []  # a standby's: from the store
        runs = [run_status(run.progress.snapshot()) for run in live[:limit]]
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
                               units_rejected=0, uptime_seconds=0.0,
                               role=None if self._leads() else STANDBY_ROLE)

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
        """Close the store and give up its lock (or its lease), for another coordinator."""
        if self.keeper is not None:
            self.keeper.stop(release=True)
        self.store.close()
        if self.lock is not None:
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


def _load_torch() -> None:
    """Import torch while standing by, as a run taken over would (best effort)."""
    try:
        import torch  # noqa: F401 - loaded for later
    except ImportError:
        log.debug("torch is not installed: runs of torch models will say so")


def open_store(settings: CoordinatorSettings) -> tuple[StoreLock | None, Store]:
    """The run store of these settings. SQLite: its folder created if needed, locked for
    this process first (a second coordinator on the same file is refused with StoreInUse
    before it can touch the first one's runs). PostgreSQL: no lock; the coordinators
    sharing it elect a leader (lead_when_elected)."""
    if settings.store_url is not None:
        # psycopg and the PostgreSQL store load only here: a coordinator on SQLite
        # starts without them
        from thrift_trainer.coordinator.postgres_store import PostgresRunStore

        return None, PostgresRunStore(settings.store_url, outage_seconds=settings.store_outage)
    path = settings.store_path or settings.run_root / "runs.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = StoreLock(path)
    try:
        return lock, RunStore(path, defer_writes=True)
    except BaseException:
        lock.release()
        raise


def _unit_info(unit: UnfinishedUnit) -> ttypes.UnitInfo:
    return ttypes.UnitInfo(round=unit.round, unit_id=unit.unit_id, status=unit.status,
                           node=unit.node, age_seconds=unit.age_seconds, attempts=unit.attempts,
                           failures=unit.failures, last_reason=unit.last_reason)
