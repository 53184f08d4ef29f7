"""One training run on the coordinator: rounds, evaluation, files and the final result."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from thrift_trainer.coordinator.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    CheckpointError,
    check_weights,
    load_checkpoint,
    load_request,
    metrics_of,
)
from thrift_trainer.coordinator.kept_results import KeptResults
from thrift_trainer.coordinator.leadership import LEASE_SECONDS
from thrift_trainer.coordinator.privacy_budget import PrivacyBudget
from thrift_trainer.coordinator.records import (
    InvalidRun,
    RunFailed,
    RunOutcome,
    RunRequest,
    RunStopped,
)
from thrift_trainer.coordinator.request_checks import RequestLimits
from thrift_trainer.coordinator.run_folder import RunFolder
from thrift_trainer.coordinator.run_setup import RUN_ID, check_run_id, prepare
from thrift_trainer.coordinator.run_setup import describe as describe_run
from thrift_trainer.coordinator.run_tasks import RunTasks
from thrift_trainer.coordinator.store_outage import OUTAGE_SECONDS
from thrift_trainer.coordinator.store_protocol import RunFiles, Store
from thrift_trainer.coordinator.store_records import RunStoreError, StoreUnavailable
from thrift_trainer.coordinator.tracking import Trackers
from thrift_trainer.coordinator.training_loop import LoopParts, TrainingLoop
from thrift_trainer.engine import runtime
from thrift_trainer.engine.cancels import END_OF_RUN_WAIT_SECONDS, shared_sender
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.node_checks import check_nodes
from thrift_trainer.engine.nodes.client import RunQuery
from thrift_trainer.engine.nodes.liveness import (
    DEAD_SECONDS,
    HEARTBEAT_SECONDS,
    SUSPECT_SECONDS,
    HeartbeatMonitor,
)
from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.quorum import TooFewNodes, wait_for_nodes
from thrift_trainer.engine.nodes.relay_groups import RelayGroups
from thrift_trainer.engine.nodes.run_nodes import Dial, RunNodes
from thrift_trainer.engine.policies import make_policy
from thrift_trainer.engine.progress import CANCELLED, COMPLETED, FAILED, RunProgress
from thrift_trainer.engine.round_engine import (
    EngineSettings,
    FatalNodeError,
    RoundEngine,
    RoundFailed,
    RunCancelledError,
    no_node_can_serve,
)
from thrift_trainer.engine.session_moves import drop_sessions
from thrift_trainer.engine.warm_up import warm_up_nodes
from thrift_trainer.training.clients.announced import Announcement, put_together
from thrift_trainer.training.units import Weights

__all__ = ["RUN_ID", "CoordinatorSettings", "Run"]

log = logging.getLogger("coordinator.run")


@dataclass(frozen=True)
class CoordinatorSettings:
    data_root: Path
    run_root: Path
    policy: int
    rpc_timeout: float = 300.0
    connect_timeout: float = 3.0
    seed: int | None = None
    engine: EngineSettings = field(default_factory=EngineSettings)
    store_path: Path | None = None  # SQLite run store; None: <run_root>/runs.db
    store_url: str | None = None  # a PostgreSQL run store instead, shared with standbys
    lease_seconds: float = LEASE_SECONDS  # with store_url: the leader's lease
    store_outage: float = OUTAGE_SECONDS  # with store_url: longest pause without the database
    heartbeat_seconds: float = HEARTBEAT_SECONDS
    suspect_seconds: float = SUSPECT_SECONDS
    dead_seconds: float = DEAD_SECONDS
    limits: RequestLimits = field(default_factory=RequestLimits)  # the most a request may ask
    wait_for_nodes: int = 0  # nodes that must have answered before the first round
    weights_dirs: tuple[Path, ...] = ()  # run.init_weights from here too (--weights-dir)
    track: tuple[str, ...] = ()  # every run's figures also go there (--track)


class Run:
    """Validates a RunRequest up front (coordinator/run_setup.py), then `execute()` trains
    it to the end, writing its folder as it goes (coordinator/run_folder.py)."""

    def __init__(self, request: RunRequest, nodes: list[NodeAddress],
                 settings: CoordinatorSettings, store: Store | None = None,
                 nodes_source: Callable[[], list[NodeAddress]] | None = None,
                 resume_from: Checkpoint | None = None,
                 membership: Membership | None = None, resumed: bool = False,
                 dial: Dial | None = None) -> None:
        self.request = request
        self.membership = membership
        self.resume_from = resume_from
        # resumed without a checkpoint: the run died before its first one, so it starts over
        self.resumed = resumed or resume_from is not None
        self.extended = False  # resumed to more rounds than first asked for (Run.resume)
        self.settings = settings
        self.store = store
        setup = prepare(request, settings.data_root, settings.limits,
                        settings.engine.deterministic,
                        (settings.run_root, *settings.weights_dirs))
        self.setup = setup
        self.run_id, self.spec, self.algorithm = setup.run_id, setup.spec, setup.algorithm
        self.compression, self.schedule = setup.spec.compression, setup.spec.schedule
        self.outputs = setup.outputs
        self.run_dir = settings.run_root / self.run_id
        keep = (lambda name, path, round_index: store.store_file(
            self.run_id, name, path, round_index)) if isinstance(store, RunFiles) else None
        self.folder = RunFolder(self.run_dir, self.algorithm, self.outputs, request.rounds,
                                keep, Trackers(settings.track))
        self._nodes = RunNodes(
            self.run_id, nodes, rpc_timeout=settings.rpc_timeout,
            connect_timeout=settings.connect_timeout, suspect_seconds=settings.suspect_seconds,
            dead_seconds=settings.dead_seconds, nodes_source=nodes_source, membership=membership,
            dial=dial)
        self._folder_started = False
        self._resident_taken = False  # node-resident clients were taken before round 1
        self._relay_groups = RelayGroups()  # relays' live members when last checked
        self.cancelled = runtime.Event()
        self.cancel_reason = ""
        self._cancels = shared_sender()  # the engine's: the run waits for them at its end
        self.finished = runtime.Event()  # set once execute() has returned or raised
        planned = setup.units_per_round
        # asynchronous modes: versions per round; by default as many as make a sync round's
        # number of units (one per result in async mode)
        updates_per_round = (self.schedule.updates_per_round or
                             -(-planned // self.schedule.results_per_version))
        units_per_round = (updates_per_round * self.schedule.results_per_version
                           if self.schedule.asynchronous else self.algorithm.quorum(planned))
        self.progress = RunProgress(self.run_id, request.rounds, units_per_round,
                                    self._nodes.summaries)
        self.progress.mode = self.schedule.mode
        self.progress.algorithm, self.progress.model = request.algorithm, request.model
        self._config_json = setup.node_config_json
        self.ledger = UnitLedger(store, self.run_id, on_failure=self.cancel)
        self._policy = make_policy(settings.policy, settings.seed)
        kept = KeptResults(store, self.ledger, self.run_id, self.folder.checkpoint_due,
                           None if resume_from is None else resume_from.round)
        self._loop = TrainingLoop(LoopParts(
            self.run_id, request, self.algorithm, self.schedule, self.compression,
            self.outputs, self.folder, self.progress, self.ledger, self._nodes, kept,
            self._policy, RunTasks(self.run_id, request, self._config_json, settings.policy),
            settings.engine.max_update_norm,
            self._check_returned_nodes if self.spec.clients.enabled else None),
            planned, updates_per_round, resume_from, self.resumed)
        if resume_from is not None:
            self._restore(resume_from)

    @classmethod
    def resume(cls, run_id: str, nodes: list[NodeAddress], settings: CoordinatorSettings,
               store: Store | None = None,
               nodes_source: Callable[[], list[NodeAddress]] | None = None,
               membership: Membership | None = None, rounds: int | None = None,
               dial: Dial | None = None) -> Run:
        """The run `run_id` of `settings.run_root`, to continue after its last checkpoint:
        from round 1 with its stored request if it died before its first checkpoint, and
        only the end-of-run writes if it died after its last. The store refuses a run
        that is recorded as completed (or still running), unless ``rounds`` extends it:
        the run then goes on from its last checkpoint to that many rounds in all, as if
        it had been asked for them (InvalidRun unless that is more than it was asked)."""
        run_dir = settings.run_root / check_run_id(run_id)
        request = load_request(run_dir)
        checkpoint = load_checkpoint(run_dir) if (run_dir / CHECKPOINT_FILE).exists() else None
        if rounds is not None:
            if rounds <= request.rounds:
                raise InvalidRun(f"rounds: extending run {run_id} needs more than the "
                                 f"{request.rounds} rounds it was asked for, got {rounds}")
            request = replace(request, rounds=rounds)
        run = cls(request, nodes, settings, store, nodes_source, resume_from=checkpoint,
                  membership=membership, resumed=True, dial=dial)
        run.extended = rounds is not None
        return run

    def cancel(self, reason: str = "cancelled by the client") -> bool:
        """Ask the run to stop; False if it had already ended."""
        if self.progress.state != "running":
            return False
        self.cancel_reason = reason
        self.cancelled.set()
        return True

    def register(self) -> None:
        """Enter the run in the store; a run id used before (even before a restart) is refused."""
        if self.store is None:
            return
        r = self.request
        if self.resumed:
            done = self.resume_from.round if self.resume_from is not None else 0
            try:
                reopened = self.store.resume_run(
                    self.run_id, done, self.request.rounds if self.extended else None)
            except RunStoreError as exc:
                raise CheckpointError(f"run {self.run_id} cannot be resumed: {exc}") from None
            log.info("run %s resumes after round %d (%d units reopened)", self.run_id,
                     done, reopened)
            return
        try:
            # one transaction: a coordinator taking over finds every run it has with the
            # request it needs (a store that keeps files keeps request.json)
            with self.store.batch():
                self.store.create_run(self.run_id, algorithm=r.algorithm, model=r.model,
                                      dataset=r.dataset, rounds=r.rounds,
                                      config=self.algorithm.config, policy=self.settings.policy)
                self._start_folder()
        except StoreUnavailable as exc:
            raise RunFailed(str(exc), nodes_tried=[]) from None
        except (RunStoreError, ValueError) as exc:
            raise InvalidRun(f"run id {self.run_id!r} cannot be used: {exc}") from None

    def execute(self) -> RunOutcome:
        """Train every round; raises RunFailed or RunStopped."""
        log.info("run %s: %s/%s on %s, %d rounds, %d nodes", self.run_id, self.request.algorithm,
                 self.request.model, self.request.dataset, self.request.rounds, len(self.nodes))
        try:
            result = self._train()
            self._end(COMPLETED)
        except StoreUnavailable as exc:
            raise self._store_failed(exc) from None
        except RunCancelledError:
            if self.ledger.failure is not None:  # the run cancelled itself: see UnitLedger
                raise self._store_failed(self.ledger.failure) from None
            self._end(CANCELLED, self.cancel_reason)
            raise RunStopped(f"run {self.run_id} was cancelled: {self.cancel_reason}") from None
        except (RoundFailed, FatalNodeError, TooFewNodes) as exc:
            self._end(FAILED, str(exc))
            tried = getattr(exc, "nodes_tried", [n.name for n in self.nodes])
            raise RunFailed(str(exc), nodes_tried=tried) from None
        except Exception as exc:
            log.exception("run %s failed", self.run_id)
            self._end(FAILED, f"internal error: {exc}")
            raise RunFailed(f"internal error: {exc}",
                            nodes_tried=[n.name for n in self.nodes]) from None
        finally:
            # what the last round left running is told to stop before the connections go
            self._cancels.wait_sent(END_OF_RUN_WAIT_SECONDS)
            # the nodes' per-run state of this run (sessions, compression residuals)
            if self.algorithm.uses_sessions or self.compression.keeps_residuals:
                drop_sessions(self.run_id, self.nodes)
            self._nodes.close()
            self.finished.set()
        return result

    def _end(self, state: str, message: str | None = None) -> None:
        """Record the end, then show it: a run is never reported completed unless the
        store holds it as completed (StoreUnavailable otherwise)."""
        self.ledger.run_ended(state, message)
        if state == COMPLETED:
            self.ledger.check()
        self.folder.end_tracking(state)
        self.progress.end(state, message)

    def _store_failed(self, exc: StoreUnavailable) -> RunFailed:
        """The run stops when its store cannot record it; the error names the file."""
        self._end(FAILED, str(exc))
        return RunFailed(str(exc), nodes_tried=[])

    # ---------------------------------------------------------------- rounds
    def _start_folder(self) -> None:
        self.folder.start(describe_run(self.setup, self.settings.policy,
                                       [n.name for n in self.nodes]), self.request)
        self._folder_started = True

    def _train(self) -> RunOutcome:
        if not self._folder_started:  # a resumed run, or one without a store
            self._start_folder()
        weights, done = self._starting_point()
        history = [metrics_of(row) for row in self.folder.rows]
        heartbeats = HeartbeatMonitor(lambda: list(self.nodes), self.settings.heartbeat_seconds,
                                      self.ledger.node_heartbeats).start()
        try:
            self._wait_for_nodes()  # before the engine, whose grace period starts with it
            self._check_nodes()
            if self.algorithm.uses_torch:  # off round 1's clock
                warm_up_nodes(self.nodes, self.request.model, self.progress, self.cancelled)
            engine = RoundEngine(self.run_id, self.nodes, self._policy,
                                 self._engine_settings(), self.progress, self.cancelled,
                                 self.ledger, self._cancels, refresh_nodes=self._joined,
                                 on_left_out=self._nodes.leave_out,
                                 recheck_nodes=(self._check_returned_nodes
                                                if self.spec.clients.enabled
                                                else lambda: None))
            weights = self._loop.run(engine, weights, done, history)
        finally:
            heartbeats.stop()
        engine.log.stop_counting()  # the node table below is the run's final one
        for node in self.nodes:  # relays' members as they end the run, not a ping ago
            node.refresh_group()
        model_path = self.folder.finish(weights, json.loads(self._config_json))
        log.info("run %s finished: validation error %.4f, model in %s", self.run_id,
                 history[-1].validation_error, model_path)
        return RunOutcome(
            run_id=self.run_id, validation_error=history[-1].validation_error,
            rounds=len(history), wall_seconds=self.progress.elapsed(), history=history,
            nodes=self._nodes.summaries(), weights=weights,
            model_json=json.dumps(self.algorithm.model_description()),
            run_dir=str(self.run_dir.resolve()),
            **self._payload_summary(),
        )

    def _payload_summary(self) -> dict[str, Any]:
        """Training-call bytes of the run and how its updates were combined and encoded."""
        down, up = self._nodes.payload.totals()
        return {"bytes_up": up, "bytes_down": down, "aggregation": self.spec.aggregation_rule,
                "compression_json": json.dumps(self.compression.to_dict())}

    def _joined(self) -> list[NodeHandle] | None:
        """The run's nodes if nodes joined or left since asked last, else None."""
        return self.nodes if self._nodes.refresh() else None

    def payload_totals(self) -> tuple[int, int]:
        """(down, up): bytes of the run's training calls so far."""
        return self._nodes.payload.totals()

    def _wait_for_nodes(self) -> None:
        """Hold the first round until --wait-for-nodes nodes have answered."""
        if self.settings.wait_for_nodes <= 0:
            return
        wait_for_nodes(self.settings.wait_for_nodes, lambda: self.nodes, self._nodes.refresh,
                       self.progress, self.cancelled, self.settings.engine.max_pause,
                       self.settings.heartbeat_seconds)
        if self.cancelled.is_set():
            raise RunCancelledError("run cancelled")

    def _check_nodes(self, nodes: list[NodeHandle] | None = None) -> None:
        """Leave out the nodes (by default all) that cannot serve a run with plug-ins or a
        torch model (engine/node_checks.py); RoundFailed when none can."""
        if self.setup.facts is None:
            return
        query = RunQuery(self.run_id, self.request.algorithm, self.request.model,
                         self.request.dataset, self._config_json)
        unfit = check_nodes(self.nodes if nodes is None else nodes, query, self.setup.facts,
                            self.spec, self.progress, self.cancelled)
        for node in unfit:
            self._nodes.leave_out(node)
        if unfit and not self.nodes:
            raise RoundFailed(no_node_can_serve(unfit), [n.name for n in unfit])
        if self.spec.clients.on_nodes:
            self._relay_groups.checked(self.nodes if nodes is None else nodes)
            self._take_node_clients()

    def _check_returned_nodes(self) -> None:
        """A run with clients: ask the pushed nodes that could not be asked before round 1
        (silent then) and answer heartbeats now which clients they hold; until they say,
        they get no client's unit (engine/nodes/pool.py's `holds`)."""
        unchecked = [n for n in self.nodes if not n.clients_checked
                     and n.liveness.state() == "alive" and n.liveness.ever_heard]
        if self.spec.clients.on_nodes:  # a relay holds its live members' clients
            unchecked += [n for n in self._relay_groups.changed(self.nodes)
                          if n not in unchecked]
        if unchecked:
            self._check_nodes(unchecked)

    def _take_node_clients(self) -> None:
        """Node-resident clients: each checked node's own data is one client or several,
        as it announced them (names, examples, label counts); the run folder keeps them.
        Two nodes announcing one name with different data refuse the run before round 1;
        a node that does so later is left out."""
        for node in self.nodes:
            # a pull node was not asked: no client of its own (a relay announces its
            # members', compute_node/relay_clients.py)
            if not node.accepts_connections or not node.client_sizes:
                node.clients = frozenset()
        clients = put_together(Announcement(node.name, node.client_sizes, node.client_labels,
                                            node.client_fingerprints)
                               for node in self.nodes)
        if clients.conflicts and not self._resident_taken:
            raise RoundFailed(f"clients.placement nodes: {clients.conflicts[0]}",
                              [n.name for n in self.nodes])
        for conflict in clients.conflicts:
            node = next(n for n in self.nodes if n.name == conflict.other)
            node.clients = frozenset()  # none of its units, from now on
            if node.leave_out(str(conflict)):
                log.warning("node %s is left out of run %s: %s", node.name, self.run_id,
                            conflict)
                self._nodes.leave_out(node)
        if not clients.sizes:
            raise RoundFailed("no node announced a client of its own data (clients.placement "
                              "nodes needs pushed nodes that check the run)",
                              [n.name for n in self.nodes])
        record = self.algorithm.take_clients(clients.sizes, clients.labels)
        budget = PrivacyBudget.of(self.algorithm)
        if budget is not None:  # the sampling rate is known now: the plan is checked
            budget.check_plan(self.request.rounds, [n.name for n in self.nodes])
        self.folder.keep_partition(record)
        self._resident_taken = True
        log.info("run %s: %d node-resident clients, %s examples", self.run_id,
                 len(record.sizes), f"{sum(record.sizes):,}")
        unsampled = sorted(set(clients.sizes) - set(record.names))
        if unsampled:  # a private run's roster is that of its first announcement
            log.info("run %s: clients %s announced after round 1 are not sampled (the "
                     "privacy accounting covers the clients announced first)", self.run_id,
                     ", ".join(unsampled))

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Take in the checkpoint's optimizer, random state and metrics, or raise
        CheckpointError now: a checkpoint that does not fit must stop --resume at start-up,
        not fail later in the run's thread."""
        path = self.folder.checkpoint_path
        check_weights(path, checkpoint.weights, self.algorithm.initial_weights())
        try:
            self.algorithm.load_state_dict(checkpoint.optimizer)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path} does not fit this run's optimizer: {exc}") from None
        if checkpoint.policy_rng is not None:
            self._policy.set_random_state(checkpoint.policy_rng)
        self.folder.restore(checkpoint.round)

    def _starting_point(self) -> tuple[Weights, int]:
        """Round 0's weights, or the checkpoint's (restored at construction)."""
        checkpoint = self.resume_from
        if checkpoint is None:
            if self.resumed:  # no round was checkpointed: rows of earlier tries go
                self.folder.restore(0)
            return self.algorithm.initial_weights(), 0
        self.progress.round_done(checkpoint.round, self._last_error(), math.nan)
        if self.store is not None:  # the units it holds, and the results taken up after it
            self.progress.add(units_done=self.store.ledger_counts(self.run_id)["completed"])
        return checkpoint.weights, checkpoint.round

    def _last_error(self) -> float:
        measured = [row["validation_error"] for row in self.folder.rows
                    if row.get("validation_error") is not None
                    and not math.isnan(row["validation_error"])]
        return measured[-1] if measured else math.nan

    @property
    def nodes(self) -> list[NodeHandle]:
        return self._nodes.nodes

    @property
    def left_out(self) -> list[NodeHandle]:
        """Nodes that cannot serve the run (engine/node_checks.py), each saying why."""
        return self._nodes.left_out

    def _engine_settings(self) -> EngineSettings:
        """No backup attempts for an algorithm whose units change state on their node, nor
        with topk updates: a duplicate would update a second residual of the slot, and the
        part its discarded result sent would be lost to error feedback."""
        if self.algorithm.allows_backups and not self.compression.keeps_residuals:
            return self.settings.engine
        return replace(self.settings.engine, speculation=False)
