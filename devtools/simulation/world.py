"""One simulated run: the real coordinator (its Run, engine, ledger and SQLite run store,
node pool, policies, deadlines, heartbeats, backups, algorithm, aggregation and update
filters) against simulated nodes, in one process, on a virtual clock (`simulate`).

Nothing here copies the coordinator's logic: `coordinator.run.Run` executes as it does in
production, with `engine.runtime` replaced by a `SimRuntime` and its nodes dialled in
process (devtools/simulation/nodes.py). The plan (devtools/simulation/plans.py) says the
run's shape and its events, which a thread of the simulation applies when their virtual
time comes. The coordinator is a process of its own in the simulation: a `kill` freezes
its threads for good and drops its store connection as a dying process does, and the run
goes on in a new one, resumed from the store as `coordinator_node.py --resume` does; a
store write that fails stops the run loudly, and it is resumed the same way.

Then the checks (`check`): the run completed (or failed with a reason that says so,
resumed); the ledger audit of the store (devtools/ledger_audit.py: no unit lost, none
applied twice, counts that add up); no write the store refused (strict ledger: every
transition legal); no thread raised what it did not handle; the ledger's failures
against the policy the run ran (devtools/simulation/accounting.py: a unit discarded after
exactly its failures, none queued again once they are used up; a stream failed after
exactly a pass of units discarded in a row), in a run that failed as its plan expects
too; in a deterministic run that discarded no unit, the final weights equal those of the
same plan without its events; each node's counters in the engine equal its row in the
store; and in a private run, at every crash point (a coordinator killed, or stopped by
its store) and at the end, the budget the store records covers the releases made
(devtools/simulation/budget.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devtools.ledger_audit import RunShape, audit
from devtools.simulation.accounting import discard_streak, failure_accounting
from devtools.simulation.budget import Releases, budget_problems, charged_releases
from devtools.simulation.nodes import HOST, NODE_PORTS, SimNode, SimNodeClient, pull_worker
from devtools.simulation.plans import Event, Plan
from devtools.simulation.scheduler import SimHang, SimRuntime
from thrift_trainer.coordinator import run_folder
from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.coordinator.run import CoordinatorSettings, Run
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.engine import runtime
from thrift_trainer.engine.ledger import STRICT_ENV, StoreUnavailable
from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.round_engine import EngineSettings
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes

log = logging.getLogger("simulation")

HEARTBEAT_SECONDS = 1.0  # the coordinator's and the pull nodes', as in production
MAX_VIRTUAL_SECONDS = 3600.0  # a plan that has not ended by then has hung
MAX_INCARNATIONS = 8  # coordinator processes a run may take (kills and store failures)
LETTERS_UNITS = 11  # the letters data set's training files: units of a round


@dataclass
class Outcome:
    """What one plan did: how its run ended, the trace and weights, what the checks found."""

    plan: Plan
    state: str = "failed"  # completed | failed | hung
    reason: str = ""
    trace: str = ""
    weights: str = ""  # SHA-256 of the final weights; "" without them
    problems: list[str] = field(default_factory=list)
    virtual_seconds: float = 0.0
    events: int = 0
    incarnations: int = 0  # coordinator processes the run took

    @property
    def failed(self) -> bool:
        return bool(self.problems)


def simulate(plan: Plan, reference: str | None = None, workdir: Path | None = None) -> Outcome:
    """Run ``plan`` and check it. ``reference``: the weights digest of the same plan without
    events, which a deterministic run must end with (computed here when None)."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
            return simulate(plan, reference, Path(tmp))
    if reference is None and plan.deterministic and plan.events:
        reference = reference_weights(plan)
    outcome = Outcome(plan)
    sim = SimRuntime(plan.seed)
    world = World(plan, sim, workdir)
    with strict_ledger(), no_curves(), runtime.installed(sim):
        try:
            sim.run(lambda: world.drive(outcome), MAX_VIRTUAL_SECONDS)
        except SimHang as exc:
            outcome.state, outcome.reason = "hung", str(exc)
    outcome.trace, outcome.events = sim.trace_digest(), sim.events
    outcome.virtual_seconds = sim.now
    outcome.problems += check(outcome, world, sim, reference)
    return outcome


_REFERENCES: dict[tuple[str, ...], str] = {}


def reference_weights(plan: Plan) -> str:
    """The final weights of the plan's run without events (once per process and settings)."""
    key = plan.reference_key()
    if key not in _REFERENCES:
        clean = simulate(plan.without_events(), "")
        if clean.failed:
            raise RuntimeError(f"the run without faults failed: {clean.problems}")
        _REFERENCES[key] = clean.weights
    return _REFERENCES[key]


@contextlib.contextmanager
def strict_ledger() -> Iterator[None]:
    """A write the store refuses raises (an illegal transition is a bug to find)."""
    before = os.environ.get(STRICT_ENV)
    os.environ[STRICT_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STRICT_ENV, None)
        else:
            os.environ[STRICT_ENV] = before


@contextlib.contextmanager
def no_curves() -> Iterator[None]:
    """The run folder's curves are not drawn: the simulator checks the training and its
    ledger, not pictures, and drawing them is most of a small run's time."""
    drawn = run_folder.save_curves
    run_folder.save_curves = lambda rows, path, title="": None
    try:
        yield
    finally:
        run_folder.save_curves = drawn


class FailingStore(RunStore):
    """The SQLite run store, whose writes fail while `full` (a full disk)."""

    full = False

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        if write and self.full:
            raise StoreUnavailable(f"run store {self.path}: database or disk is full "
                                   "(simulated)")
        with super()._tx(write) as db:
            yield db


class World:
    """The coordinator's processes, its store and its nodes, as one plan builds them."""

    def __init__(self, plan: Plan, sim: SimRuntime, workdir: Path) -> None:
        self.plan, self.sim, self.workdir = plan, sim, workdir
        self.nodes: list[SimNode] = []
        self.membership: Membership | None = None
        self.run: Run | None = None
        self.store: FailingStore | None = None
        self.incarnation = 0
        self.result: Any = None
        self.run_ended: Any = None  # set when the current coordinator's run ends or dies
        self.error: BaseException | None = None
        self.killed = False
        # a private run's releases, as nodes, checkpoints and the status showed them, and
        # what the budget check found at the crash points
        self.releases = Releases() if plan.private else None
        self.budget_problems: list[str] = []

    # ------------------------------------------------------------- the run
    def drive(self, outcome: Outcome) -> None:
        self._build_nodes()
        while True:
            self._start_coordinator()
            if self.incarnation == 1:  # the nodes start once the coordinator is up
                self._start_pull_nodes()
                self.sim.start_thread(self._chaos, "chaos")
            self.run_ended.wait()
            outcome.incarnations = self.incarnation
            if self.result is None:  # killed, or stopped by its store: a crash point
                self.budget_problems += self.budget_check(f"coordinator{self.incarnation} "
                                                          "ended")
            if self.result is not None:
                outcome.state = "completed"
                outcome.weights = weights_digest(self.result.weights)
                return
            if self.incarnation >= MAX_INCARNATIONS or not (self.killed or
                                                            self._store_failed()):
                outcome.state, outcome.reason = "failed", str(self.error)
                return
            self._end_coordinator()  # gone for good; the run resumes in a new process

    @property
    def _owner(self) -> str:
        return f"coordinator{self.incarnation}"

    def _store_failed(self) -> bool:
        """Whether the run stopped because its store could not write; if so, the disk
        has room again for the next process."""
        if self.store is None or not self.store.full:
            return False
        self.store.full = False
        return True

    def budget_check(self, when: str) -> list[str]:
        """A private run's budget in the store against the releases made so far: the
        weights nodes were sent, the checkpoint on disk, the status the coordinator
        showed last (docs: devtools/simulation/budget.py)."""
        if self.releases is None:
            return []
        run_id = f"sim{self.plan.seed}"
        self.releases.saw_checkpoint(self.workdir / "runs" / run_id)
        if self.run is not None:  # this process's run, built: what its status shows
            self.releases.seen(self.run.progress.round, f"the status of {self._owner}")
        charged = charged_releases(self.workdir / "runs.db", run_id)
        return budget_problems(charged, self.releases, when)

    def _start_coordinator(self) -> None:
        self.incarnation += 1
        self.result, self.error, self.killed = None, None, False
        self.run = None  # built by the new process
        self.run_ended = runtime.Event()
        if self.plan.pulled:  # registrations live in the coordinator's process
            self.membership = Membership(heartbeat_seconds=HEARTBEAT_SECONDS)
        self.sim.start_thread(self._coordinator, self._owner, owner=self._owner)

    def _coordinator(self) -> None:
        """The coordinator's process: open the store, build or resume the run, train."""
        ended = self.run_ended
        try:
            settings = self._settings()
            self.store = FailingStore(settings.store_path)
            addresses = [NodeAddress(HOST, NODE_PORTS + n.index) for n in self.nodes
                         if not n.pull]
            if self.incarnation == 1:
                self.run = Run(self._request(), addresses, settings, self.store,
                               membership=self.membership, dial=self._dial)
            else:  # as coordinator_node.py does at start, then with --resume
                self.store.fail_unfinished_runs("the coordinator stopped during the run")
                self.run = Run.resume(self._request().run_id, addresses, settings, self.store,
                                      membership=self.membership, dial=self._dial)
            self.run.register()
            self.result = self.run.execute()
        except Exception as exc:  # noqa: BLE001 - a failed run is an outcome
            self.error = exc
        finally:
            ended.set()

    def _end_coordinator(self) -> None:
        """The coordinator's process is gone: its threads never run again, its store
        connection is dropped (what it had not committed is rolled back)."""
        self.sim.kill(self._owner)
        if self.store is not None:
            self.store.abandon()

    def _kill(self) -> None:
        """A SIGKILL of the coordinator: the driver sees its run end, and resumes it."""
        self.killed = True
        self._end_coordinator()
        self.run_ended.set()

    # ------------------------------------------------------------- the world
    def _build_nodes(self) -> None:
        plan = self.plan
        for index in range(plan.nodes):
            self.nodes.append(SimNode(
                f"n{index}", index, DEFAULT_DATA_ROOT, self.sim, pull=index >= plan.pushed,
                held=plan.held_by(index),
                watch=None if self.releases is None else self.releases.node_sent))

    def _start_pull_nodes(self) -> None:
        for node in self.nodes:
            if node.pull:
                self.sim.start_thread(pull_worker, f"pull-{node.name}",
                                      args=(node, lambda: self.membership, HEARTBEAT_SECONDS),
                                      owner=f"node-{node.name}")

    def _chaos(self) -> None:
        for event in self.plan.events:
            runtime.sleep(max(0.0, event.at - runtime.monotonic()))
            self.sim.note("event", str(event))
            self._apply(event)

    def _apply(self, event: Event) -> None:
        if event.kind == "kill":
            if self.run_ended is not None and not self.run_ended.is_set():
                self._kill()
            return
        if event.kind == "store_fail":
            if self.store is not None:
                self.store.full = True
            return
        node = self.nodes[event.node]
        faults = node.faults
        if event.kind == "crash":
            node.die()
        elif event.kind == "restart":
            faults.crashed = False
        elif event.kind in ("hang", "release"):
            faults.hung = event.kind == "hang"
        elif event.kind in ("partition", "heal"):
            faults.partitioned = event.kind == "partition"
        elif event.kind == "slow":
            faults.slowdown = event.value
        elif event.kind == "reject":
            faults.reject = event.value
        elif event.kind == "corrupt":
            faults.corrupt += int(event.value)
        elif event.kind == "lose":
            faults.lose_replies += int(event.value)
        elif event.kind == "duplicate":
            faults.duplicate_replies += int(event.value)
        elif event.kind in ("leave", "join"):
            self._leave_or_join(node, event.kind)

    def _leave_or_join(self, node: SimNode, kind: str) -> None:
        if kind == "join":
            node.faults.crashed = False  # its process starts again (a pull node registers)
            return
        node.die()
        if node.pull:  # it says goodbye first
            for member in self.membership.members():
                if member.name == f"pull:{node.name}":
                    self.membership.leave(ttypes.LeaveRequest(
                        protocol_version=PROTOCOL_VERSION, node=member.name,
                        secret=member.secret))

    # ------------------------------------------------------------- settings
    def _settings(self) -> CoordinatorSettings:
        plan = self.plan
        return CoordinatorSettings(
            data_root=DEFAULT_DATA_ROOT, run_root=self.workdir / "runs", policy=plan.policy,
            seed=plan.seed, store_path=self.workdir / "runs.db",
            heartbeat_seconds=HEARTBEAT_SECONDS,
            # pull nodes alone: the first round waits for one to register, as such a
            # coordinator is run (--wait-for-nodes 1), and a plan's faults find it in the run
            wait_for_nodes=1 if plan.pushed == 0 else 0,
            engine=EngineSettings(deterministic=plan.deterministic, grace_seconds=300.0,
                                  max_unit_failures=plan.max_unit_failures))

    def _dial(self, index: int, address: NodeAddress) -> NodeHandle:
        node = self.nodes[address.port - NODE_PORTS]
        return NodeHandle(index, f"{HOST}:{address.port}", SimNodeClient(node))

    def _request(self) -> RunRequest:
        config = load_run_config(None, self.plan.settings())
        return RunRequest(run_id=f"sim{self.plan.seed}", algorithm=config.algorithm,
                          model=config.model, dataset=config.dataset, rounds=config.rounds,
                          config_json=json.dumps(config.algorithm_config()),
                          outputs_json=json.dumps(dict(config.outputs)))


# ------------------------------------------------------------------ checks
def check(outcome: Outcome, world: World, sim: SimRuntime, reference: str | None) -> list[str]:
    """What is wrong with the run the plan made (nothing: an empty list)."""
    problems = [f"thread {name} raised {exc!r}" for name, exc in sim.errors]
    problems += world.budget_problems + world.budget_check("at the end")
    if outcome.state == "hung":
        problems.append(f"the run hung: {outcome.reason}")
        return problems
    plan = outcome.plan
    store, run_id = world.workdir / "runs.db", f"sim{plan.seed}"
    problems += failures(outcome, store, run_id)
    expected = plan.expect_failure
    if expected:
        if outcome.state != "failed" or expected not in outcome.reason:
            problems.append(f"the run should have failed saying {expected!r}; it "
                            f"{outcome.state}: {outcome.reason}")
        return problems
    if outcome.state != "completed":
        problems.append(f"the run did not complete: {outcome.reason}")
        return problems
    units = max(1, plan.clients // 2) if plan.clients else LETTERS_UNITS
    dropped = dropped_clients(world, run_id)
    shape = RunShape(plan.rounds, units, plan.mode, plan.results_per_round(units), dropped,
                     units_per_pass=1 if plan.clients else 0)  # a stream's draws: one each
    ledger = audit(store, run_id, shape)
    problems += [f"ledger: {c.name}: {c.detail}" for c in ledger.checks if not c.ok]
    problems += client_placement(plan, store, run_id)
    # A discard (the policy, which the failure accounting holds to its count) leaves a
    # unit's result out, and so does a client that dropped out of a round (its holder was
    # away): the run's weights are then not those of the run without faults.
    discarded = ledger.statuses.get("discarded", 0) + len(dropped)
    if reference and plan.deterministic and not discarded and outcome.weights != reference:
        problems.append(f"the final weights {outcome.weights[:12]} differ from the run "
                        f"without faults ({reference[:12]})")
    if outcome.incarnations == 1:  # a resumed run's engine counted only its own part
        problems += node_counts(world, f"sim{plan.seed}")
    return problems


def client_placement(plan: Plan, store: Path, run_id: str) -> list[str]:
    """Every attempt of a client's unit went to a node that holds the client."""
    if not plan.clients:
        return []
    db = sqlite3.connect(store)
    try:
        rows = db.execute("SELECT DISTINCT unit_id, node FROM attempts WHERE run_id = ?",
                          (run_id,)).fetchall()
    finally:
        db.close()
    problems = []
    for client, node in rows:
        index = int(node.rpartition(":")[2]) - NODE_PORTS if node.startswith(HOST) else None
        held = plan.held_by(index) if index is not None else None
        index_of = int(client.partition(".d")[0].removeprefix("client"))  # a draw: client3.d7
        if held is not None and not held[0] <= index_of <= held[1]:
            problems.append(f"a unit of {client} went to node n{index}, which does not hold "
                            f"it (it holds clients {held[0]}-{held[1]})")
    return problems[:5]


def dropped_clients(world: World, run_id: str) -> frozenset[tuple[int, str]]:
    """(round, client) of the clients that dropped out of a round (clients.jsonl)."""
    path = world.workdir / "runs" / run_id / "clients.jsonl"
    if not path.is_file():
        return frozenset()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return frozenset((row["round"], row["client"]) for row in rows
                     if "dropped" in row and row.get("kind") != "eval")  # training units


def failures(outcome: Outcome, store: Path, run_id: str) -> list[str]:
    """The ledger's failures against the plan's limit, and a stream's discards in a row
    against its pass; in a run that failed as its plan expects too (it discarded units)."""
    if not store.is_file():
        return []
    plan = outcome.plan
    problems = failure_accounting(store, run_id, plan.max_unit_failures)
    if plan.mode != "sync":
        reason = outcome.reason if outcome.state == "failed" else ""
        # a stream of client draws fails after as many discards as there are clients
        problems += discard_streak(store, run_id, plan.clients or LETTERS_UNITS, reason)
    return problems


def node_counts(world: World, run_id: str) -> list[str]:
    """Each node's counters in the engine (the run's result) against its row in the store."""
    counted = {n.node: n for n in world.result.nodes}
    db = sqlite3.connect(world.workdir / "runs.db")
    try:
        rows = db.execute("SELECT node, accepted, rejected, failed, cancelled, samples "
                          "FROM nodes WHERE run_id = ?", (run_id,)).fetchall()
    finally:
        db.close()
    problems = []
    for node, *stored in rows:
        summary = counted.get(node)
        if summary is None:
            continue
        engine = [summary.accepted, summary.rejected, summary.failed, summary.cancelled,
                  summary.samples]
        if engine != stored:
            problems.append(f"node {node}: the engine counted accepted, rejected, failed, "
                            f"cancelled, samples {engine}, the store {stored}")
    return problems


def weights_digest(weights: dict[str, Any]) -> str:
    """SHA-256 of the weights' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        value = np.ascontiguousarray(weights[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape}\n".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()
