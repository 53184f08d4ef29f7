"""Compute nodes of a simulation: in process, on the virtual clock, with faults to switch.

A `SimNode` computes a unit with the real algorithm (the letters MLP's numpy maths on the
shipped data, say), but its time is virtual: a unit takes `UNIT_SECONDS` times its
slowdown, waited on the runtime's clock, so that deadlines, heartbeats and backups meet it
as they would a real node. One unit at a time, as a node. What it does wrong is its
`faults`, which the plan's events switch as virtual time passes (devtools/simulation/
plans.py): crashed, hung, slow, rejecting, corrupting, partitioned from the coordinator,
losing or repeating its replies.

A pushed node is called through `SimNodeClient`, the engine's NodeClient seam
(engine/nodes/client.py): an abort (a deadline, a dead node) ends the call at once, as an
interrupted socket does. A pull node runs `pull_worker` in threads of its own against the
coordinator's real Membership, registering, heartbeating, leasing and submitting as a pull
node does over Thrift.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.client import AttemptKey, NodePing, RunAnswer, RunQuery
from thrift_trainer.engine.nodes.errors import AttemptAborted, NodeRefused, NodeUnavailable
from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.thrift_client import task_result, work_request
from thrift_trainer.engine.tasks import Task, TaskResult
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.clients.settings import NAME_PREFIX
from thrift_trainer.training.compression import compress_update, decompress
from thrift_trainer.training.data.paths import data_location
from thrift_trainer.training.payload_checks import PayloadForm, check_payload
from thrift_trainer.training.run_check import run_facts
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.training.units import UnitJob, UnitSpec
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.stats import PayloadBytes
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict

log = logging.getLogger("simulation.nodes")

UNIT_SECONDS = 1.0  # virtual seconds a unit takes on a healthy node
POLL_SECONDS = 1.0  # how often a hung node looks whether it was released
HOST = "sim"
NODE_PORTS = 10000  # pushed node n<k> is sim:<10000 + k>
REPLY_SECONDS = 0.01  # virtual seconds of a call a node answers at once (a refusal)


@dataclass
class Faults:
    """What a node does wrong right now; the plan's events change these as time passes."""

    crashed: bool = False  # refuses every connection (a dead process)
    hung: bool = False  # takes calls and never answers (SIGSTOP)
    partitioned: bool = False  # the coordinator cannot reach it, nor it the coordinator
    slowdown: float = 1.0  # a unit takes this many times its time
    reject: float = 0.0  # chance of rejecting a unit (simulated load)
    corrupt: int = 0  # the next this many results carry a NaN (the filters refuse them)
    lose_replies: int = 0  # the next this many replies never arrive (computed, then lost)
    duplicate_replies: int = 0  # a pull node submits the next this many results twice


class Call:
    """One call in progress on a node: the coordinator may abort it."""

    def __init__(self) -> None:
        self.aborted = runtime.Event()
        self.reason = ""

    def wait(self, seconds: float) -> None:
        """Spend ``seconds`` of virtual time; AttemptAborted if aborted meanwhile."""
        if self.aborted.wait(seconds):
            raise AttemptAborted(self.reason)


NEVER_ABORTED = None  # a pull node's calls: the coordinator withdraws a lease instead


@dataclass
class SimNode:
    """One simulated compute node: its faults, its counters, its calls in progress."""

    name: str
    index: int
    data_root: Path
    sim: Any  # the SimRuntime, whose trace the node writes to
    pull: bool = False
    faults: Faults = field(default_factory=Faults)
    units_done: int = 0
    lives: int = 0  # how many times its process died: a new life is a new process
    held: tuple[int, int] | None = None  # the clients (first, last) it holds; None: all
    # told of every work request the node is sent (the weights it then has seen)
    watch: Callable[[ttypes.WorkRequest], None] | None = None

    def holds(self, client: str | None) -> bool:
        """Whether it holds the data of ``client`` (a unit of no client: yes)."""
        if client is None or self.held is None:
            return True
        first, last = self.held
        return first <= int(client.removeprefix(NAME_PREFIX)) <= last

    def __post_init__(self) -> None:
        # One unit at a time, as a node computes them. Not a lock, nor a condition over
        # one: a pushed node computes in its caller's thread, and a call whose caller's
        # process was killed must not hold the node forever (the node finishes the unit;
        # its answer goes nowhere). A kill freezes the caller's threads wherever they
        # are, inside a lock's critical section too, and a simulated lock a frozen thread
        # holds is never released: the node's other callers, the resumed coordinator's,
        # would wait for it for good. So the turn is the holder alone, checked for being
        # alive, and an event that tells the waiters it is free; between the scheduler's
        # switches nothing else runs, so looking at the holder and taking the turn is
        # one step.
        self._holder: Any = None
        self._turn_free = runtime.Event()
        self._rng = runtime.Random()
        self._calls: dict[AttemptKey, Call] = {}
        self._cancelled: set[AttemptKey] = set()

    def reachable(self) -> bool:
        return not (self.faults.crashed or self.faults.partitioned)

    def die(self) -> None:
        """Its process ends (a crash, or it left): it refuses connections until it
        starts again as a new process."""
        self.faults.crashed = True
        self.lives += 1

    # -------------------------------------------------------------- the maths
    def compute(self, request: ttypes.WorkRequest, call: Call) -> ttypes.TrainResult:
        """The node's answer to a work request, its virtual time spent first."""
        key = (request.run_id, request.unit_id, request.attempt)
        self.sim.note("unit", self.name, *key)
        if self.watch is not None:
            self.watch(request)
        while self.faults.hung:  # took the call, answers nothing until released
            call.wait(POLL_SECONDS)
        if self._rng.random() < self.faults.reject:
            return _answer(ttypes.UnitOutcome.REJECTED, self.name, "node busy")
        self._take_turn()
        try:
            call.wait(UNIT_SECONDS * self.faults.slowdown)
            if key in self._cancelled:
                return _answer(ttypes.UnitOutcome.CANCELLED, self.name,
                               "cancelled by the coordinator")
            try:
                update, output = self._run_unit(request)
            except UnitCancelled:
                return _answer(ttypes.UnitOutcome.CANCELLED, self.name,
                               "cancelled by the coordinator")
        finally:
            self._end_turn()
        if self.faults.corrupt:
            self.faults.corrupt -= 1
            name = next(iter(update))
            update[name] = np.full(np.shape(update[name]), math.nan)
            self.sim.note("corrupted", self.name, *key)
        self.units_done += 1
        return ttypes.TrainResult(
            accepted=True, outcome=ttypes.UnitOutcome.COMPLETED, update=dict_to_wire(update),
            num_samples=output.num_samples, loss=output.loss, error=output.error,
            compute_seconds=UNIT_SECONDS * self.faults.slowdown, delay_seconds=0.0,
            node_id=self.name, model_version=request.model_version)

    def _take_turn(self) -> None:
        me = self.sim.current()
        while self._holder is not None and not self._holder.frozen:
            self._turn_free.clear()
            self._turn_free.wait(POLL_SECONDS)  # (a frozen holder never ends its turn)
        self._holder = me

    def _end_turn(self) -> None:
        self._holder = None
        self._turn_free.set()

    def _run_unit(self, request: ttypes.WorkRequest) -> tuple[dict[str, np.ndarray], Any]:
        """The unit's update as the node would send it (compressed as the run says)."""
        spec = RunSpec.parse(request.algorithm, request.model, request.dataset,
                             request.config_json)
        algorithm = get_algorithm(spec.algorithm)
        config = spec.algorithm_config()
        algorithm.check_config(request.model, config)
        payload = wire_to_dict(request.weights)
        check_payload(payload, PayloadForm(spec.compression.down))
        weights = {name: value.copy() for name, value in decompress(payload).items()}
        unit = UnitSpec(request.unit_id, request.unit_path, request.index_start,
                        request.index_stop, client=request.client)
        job = UnitJob(request.run_id, request.round, unit, request.model, config, weights,
                      control=UnitControl(), algorithm=request.algorithm,
                      dataset=request.dataset, config_json=request.config_json or "",
                      model_version=request.model_version)
        output = algorithm.run_unit(job, data_location(self.data_root, request.dataset))
        update = compress_update(output.update, spec.compression, None, job.run_id,
                                 algorithm.unit_slot(unit, config), job.round)
        return dict(update), output

    # --------------------------------------------------------------- calls
    def begin(self, key: AttemptKey) -> Call:
        call = self._calls[key] = Call()
        return call

    def end(self, key: AttemptKey) -> None:
        self._calls.pop(key, None)

    def abort(self, key: AttemptKey, reason: str) -> bool:
        call = self._calls.get(key)
        if call is None:
            return False
        call.reason = reason
        call.aborted.set()
        return True

    def cancel(self, run_id: str, unit_id: str, attempt: int | None) -> None:
        held = [k for k in self._calls if k[:2] == (run_id, unit_id)]
        self._cancelled.update(k for k in held if attempt in (None, k[2]))
        if attempt is not None:
            self._cancelled.add((run_id, unit_id, attempt))


class SimNodeClient:
    """A pushed SimNode as the engine calls it (engine.nodes.client.NodeClient)."""

    accepts_connections = True

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.address: NodeAddress | None = NodeAddress(HOST, NODE_PORTS + node.index)
        self.payload = PayloadBytes()

    def _reach(self) -> None:
        if not self.node.reachable():
            raise NodeUnavailable(f"cannot connect to {self.address}: connection refused")

    def train(self, task: Task) -> TaskResult:
        self._reach()
        if not self.node.holds(task.client):  # as a real node refuses (InvalidRequest),
            runtime.sleep(REPLY_SECONDS)  # after a round trip
            raise NodeRefused(f"{self.address}: node {self.node.name} does not hold "
                              f"{task.client}")
        node, key = self.node, task.key
        call = node.begin(key)
        try:
            result = node.compute(work_request(task), call)
            if node.faults.lose_replies:
                node.faults.lose_replies -= 1
                node.sim.note("lost reply", node.name, *key)
                while True:  # the caller waits for an answer that never comes
                    call.wait(POLL_SECONDS * 60)
            if not node.reachable():  # crashed or cut off while it computed
                raise AttemptAborted(f"{self.address} closed the connection")
            return task_result(result, task)
        finally:
            node.end(key)

    def abort(self, key: AttemptKey, reason: str) -> bool:
        return self.node.abort(key, reason)

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        self._reach()
        self.node.cancel(run_id, unit_id, attempt)

    def ping(self, warm_up: str | None = None) -> NodePing:
        self._reach()
        if self.node.faults.hung:
            raise NodeUnavailable(f"{self.address} did not answer a ping in time")
        return NodePing()

    def check_run(self, query: RunQuery) -> RunAnswer:
        """Nothing to compare, except the clients a node holds (which the engine needs)."""
        self._reach()
        spec = RunSpec.parse(query.algorithm, query.model, query.dataset, query.config_json)
        if not spec.clients.enabled or self.node.held is None:
            return RunAnswer()
        facts = run_facts(spec, data_location(self.node.data_root, query.dataset))
        first, last = self.node.held
        return RunAnswer(replace(facts, clients=tuple(
            f"{NAME_PREFIX}{k}" for k in range(first, last + 1))))

    def send_session(self, *args: Any) -> int:
        raise NodeRefused("simulated nodes keep no sessions")

    export_session = import_session = send_session

    def drop_sessions(self, run_id: str) -> None:
        """No sessions."""

    def forget_connections(self) -> None:
        """No connections."""

    def close(self) -> None:
        """No connections."""


def pushed_handle(node: SimNode) -> NodeHandle:
    return NodeHandle(node.index, f"{HOST}:{NODE_PORTS + node.index}", SimNodeClient(node))


# ------------------------------------------------------------------ pull nodes
@dataclass
class Registration:
    """A pull node process's registration: the name and secret its calls carry."""

    name: str
    secret: str
    life: int  # the node's process that registered (SimNode.lives)
    silent: Any  # an event: set when this registration's heartbeats must stop


def pull_worker(node: SimNode, coordinator: Callable[[], Membership],
                heartbeat_seconds: float) -> None:
    """A pull node's life: register, then lease, compute and submit, with heartbeats in a
    thread of its own. As the node's process does, it keeps its registration while cut
    off (a partition), registers anew once restarted (a new process) and registers again
    when the coordinator does not know it (the coordinator restarted, or the node left).
    ``coordinator`` gives the current coordinator process's membership."""
    registration: Registration | None = None
    while True:
        if not node.reachable() or node.faults.hung:
            runtime.sleep(POLL_SECONDS)
            continue
        if registration is None or registration.life != node.lives:
            registration = _register(node, coordinator(), heartbeat_seconds)
        if not _lease_until_cut_off(node, coordinator(), registration):
            registration.silent.set()  # not known: its next lease registers again
            registration = None


def _register(node: SimNode, membership: Membership, heartbeat_seconds: float) -> Registration:
    registered = membership.register(ttypes.RegisterRequest(
        protocol_version=PROTOCOL_VERSION, node_id=node.name, pull=True))
    node.sim.note("registered", registered.node, node.lives)
    registration = Registration(registered.node, registered.secret, node.lives,
                                runtime.Event())
    runtime.start_thread(_heartbeats, f"{registered.node}-heartbeats",
                         args=(node, membership, registration, heartbeat_seconds))
    return registration


def _lease_until_cut_off(node: SimNode, membership: Membership,
                         registration: Registration) -> bool:
    """Lease, compute and submit while the node's process lives and reaches the
    coordinator; False once the coordinator does not know the registration."""
    name, secret = registration.name, registration.secret
    while node.reachable() and not node.faults.hung and registration.life == node.lives:
        lease = membership.lease(ttypes.LeaseRequest(
            protocol_version=PROTOCOL_VERSION, node=name, secret=secret, wait_seconds=2.0))
        if not lease.known:
            return False
        if lease.work is None:
            continue
        work = lease.work
        key = (work.run_id, work.unit_id, work.attempt)
        result = node.compute(work, Call())
        if not node.reachable() or registration.life != node.lives:
            return True  # the result is lost with the connection (or the process)
        if node.faults.lose_replies:
            node.faults.lose_replies -= 1
            node.sim.note("lost reply", name, *key)
            continue
        submit = ttypes.SubmitRequest(protocol_version=PROTOCOL_VERSION, node=name,
                                      secret=secret, run_id=work.run_id, unit_id=work.unit_id,
                                      attempt=work.attempt, result=result)
        answers = [membership.submit(submit).accepted]
        if node.faults.duplicate_replies:
            node.faults.duplicate_replies -= 1
            answers.append(membership.submit(submit).accepted)
        node.sim.note("submitted", name, *key, *answers)
    return True


def _heartbeats(node: SimNode, membership: Membership, registration: Registration,
                seconds: float) -> None:
    """Until the registration ends or its process dies; none while cut off or hung."""
    while not registration.silent.wait(seconds) and registration.life == node.lives:
        if node.reachable() and not node.faults.hung:
            membership.heartbeat(ttypes.HeartbeatRequest(
                protocol_version=PROTOCOL_VERSION, node=registration.name,
                secret=registration.secret, units_running=0))


def _answer(outcome: int, node: str, message: str) -> ttypes.TrainResult:
    return ttypes.TrainResult(accepted=False, outcome=outcome, update=[], num_samples=0,
                              loss=0.0, error=0.0, compute_seconds=0.0, delay_seconds=0.0,
                              message=message, node_id=node)
