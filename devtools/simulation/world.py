"""One simulated run: the real coordinator (its Run, engine, ledger and SQLite run store,
node pool, policies, deadlines, heartbeats, backups, algorithm, aggregation and update
filters) against simulated nodes, in one process, on a virtual clock (`simulate`).

Nothing here is a copy of the coordinator's logic: `coordinator.run.Run` executes as it
does in production, with `engine.runtime` replaced by a `SimRuntime` and node handles
dialled in process (devtools/simulation/nodes.py). The plan (devtools/simulation/plans.py)
says the run's shape (mode, nodes pushed and pulling) and its faults, which a thread of
the simulation applies when their virtual time comes. The coordinator may be killed at
an event and resumed from its store, as `coordinator_node.py --resume` does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.records import RunRequest
from coordinator.run import CoordinatorSettings, Run
from coordinator.run_store import RunStore
from devtools.simulation.nodes import HOST, SimNode, SimNodeClient, pull_worker
from devtools.simulation.plans import Plan
from devtools.simulation.scheduler import SimHang, SimRuntime
from engine import runtime
from engine.nodes.membership import Membership
from engine.nodes.nodes_file import NodeAddress
from engine.nodes.pool import NodeHandle
from engine.round_engine import EngineSettings
from training.data.paths import DEFAULT_DATA_ROOT
from training.run_config import load_run_config

log = logging.getLogger("simulation")

HEARTBEAT_SECONDS = 1.0  # the coordinator's and pull nodes', as in production
MAX_VIRTUAL_SECONDS = 3600.0  # a plan that has not ended by then hangs


@dataclass
class Outcome:
    """What one plan did: how the run ended, the trace and weights, and the checks' verdicts."""

    plan: Plan
    state: str  # completed | failed | hung
    reason: str = ""
    trace: str = ""
    weights: str = ""  # SHA-256 of the final weights, "" without them
    problems: list[str] = field(default_factory=list)  # what the checks found
    virtual_seconds: float = 0.0
    events: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.problems)


def simulate(plan: Plan, workdir: Path | None = None) -> Outcome:
    """Run ``plan`` and check it; a fresh folder for its store and run unless given."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
            return simulate(plan, Path(tmp))
    sim = SimRuntime(plan.seed)
    world = World(plan, sim, workdir)
    outcome = Outcome(plan, "failed")
    with runtime.installed(sim):
        try:
            sim.run(lambda: world.drive(outcome), MAX_VIRTUAL_SECONDS)
        except SimHang as exc:
            outcome.state, outcome.reason = "hung", str(exc)
    outcome.trace, outcome.events = sim.trace_digest(), sim.events
    outcome.virtual_seconds = sim.now
    outcome.problems += [f"thread {name} raised {exc!r}" for name, exc in sim.errors]
    if outcome.state == "hung":
        outcome.problems.append(f"the run hung: {outcome.reason}")
    return outcome


class World:
    """The coordinator's process and its nodes, as one plan builds them."""

    def __init__(self, plan: Plan, sim: SimRuntime, workdir: Path) -> None:
        self.plan, self.sim, self.workdir = plan, sim, workdir
        self.nodes: list[SimNode] = []
        self.membership: Membership | None = None

    def drive(self, outcome: Outcome) -> None:
        self._build()
        run = self._run()
        run.register()
        try:
            result = run.execute()
        except Exception as exc:  # noqa: BLE001 - a failed run is an outcome
            outcome.state, outcome.reason = "failed", str(exc)
            return
        outcome.state = "completed"
        outcome.weights = weights_digest(result.weights)

    def _build(self) -> None:
        plan = self.plan
        for index in range(plan.pushed + plan.pulled):
            pull = index >= plan.pushed
            node = SimNode(f"n{index}", index, DEFAULT_DATA_ROOT, self.sim, pull=pull)
            self.nodes.append(node)
        if plan.pulled:
            self.membership = Membership(heartbeat_seconds=HEARTBEAT_SECONDS)
            for node in self.nodes:
                if node.pull:
                    runtime.start_thread(pull_worker, f"pull-{node.name}",
                                         args=(node, self.membership, HEARTBEAT_SECONDS))

    def _settings(self) -> CoordinatorSettings:
        plan = self.plan
        return CoordinatorSettings(
            data_root=DEFAULT_DATA_ROOT, run_root=self.workdir / "runs", policy=plan.policy,
            seed=plan.seed, store_path=self.workdir / "runs.db",
            heartbeat_seconds=HEARTBEAT_SECONDS,
            engine=EngineSettings(deterministic=plan.deterministic, grace_seconds=120.0))

    def _run(self) -> Run:
        settings = self._settings()
        store = RunStore(settings.store_path)
        addresses = [NodeAddress(HOST, 10000 + n.index) for n in self.nodes if not n.pull]
        return Run(self._request(), addresses, settings, store, membership=self.membership,
                   dial=self._dial)

    def _dial(self, index: int, address: NodeAddress) -> NodeHandle:
        node = self.nodes[address.port - 10000]
        return NodeHandle(index, f"{HOST}:{address.port}", SimNodeClient(node))

    def _request(self) -> RunRequest:
        config = load_run_config(None, self.plan.settings())
        return RunRequest(run_id=f"sim{self.plan.seed}", algorithm=config.algorithm,
                          model=config.model, dataset=config.dataset, rounds=config.rounds,
                          config_json=json.dumps(config.algorithm_config()),
                          outputs_json=json.dumps(dict(config.outputs)))


def weights_digest(weights: dict[str, Any]) -> str:
    """SHA-256 of the weights' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        value = np.ascontiguousarray(weights[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape}\n".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()
