"""A relay node: the ComputeNode service upward, the coordinator's round engine downward.

`python compute_node.py <port> <load_prob> --relay <nodes_file>` serves units like any node,
but computes each on the group of nodes its file lists (which may be relays themselves).
A unit with an index range (`sync_sgd`) is split into one contiguous slice per member;
a unit that is a whole file (`delta_avg`, `fl_gan`) goes to one member, and the relay
takes as many units at once as it has members, so its policy balances them. The slices
run as one round of the engine the coordinator uses (engine/round_engine.py): the
same policies, load handling, backups, benching, deadlines and fault handling. Their
results are combined by the run's aggregation rule, weighted by samples, into one result
for the whole unit: the coordinator's link carries one update per unit whatever the size
of the group. For a gradient (the mean over the unit's examples) the combined slices equal
the whole unit's up to float rounding.

With ``hierarchy.relay_local_rounds`` H > 1 in the run's config (training/hierarchy.py,
`delta_avg`), a relay instead cuts each unit into one share per member (the algorithm's
`run_unit_part`: a member computes only its share) and runs H rounds of its own: the
members train from the group's weights, the relay adds the average of their deltas, and
the group's whole change goes up as one update (hierarchical FedAvg). A share that comes
from a relay above is computed whole by one member.

A unit of a federated client goes whole to a member that holds the client, never to
one that does not (the engine's `holds`, from the members' run checks). With node-resident
clients (`clients.placement: nodes`) the relay's run check answers the union of its live
members' own clients (compute_node/relay_clients.py): a relay holds its members' clients.

A relay checks its members' results as the coordinator checks its own nodes' (before
decoding, the run's codec, the tensors and their size; then sample counts, finite values
and the norm guard, whose history it keeps per run: engine/update_filters.py), the tensors
to expect coming with each unit. A member whose result is refused is benched and its slice
goes to another member; the relay's pings report why, in its group's node table.

The relay's own load simulation applies to the relay as a whole; a cancel from above
cancels the unit's slices on the members. A slice that fails everywhere fails the unit
(the coordinator retries it, on this relay or another node). Algorithms that keep state
on nodes (MD-GAN's sessions) cannot run through a relay and are refused.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from thrift_trainer.compute_node.handler import ComputeNodeHandler, unit_result
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.relay_clients import MemberClients, announced
from thrift_trainer.engine import runtime
from thrift_trainer.engine.node_checks import node_problems
from thrift_trainer.engine.nodes.client import RunQuery
from thrift_trainer.engine.nodes.liveness import DEAD_SECONDS, SUSPECT_SECONDS, HeartbeatMonitor
from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.nodes_file import NodesFile
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.run_nodes import RunNodes
from thrift_trainer.engine.nodes.thrift_client import node_summary
from thrift_trainer.engine.policies import make_policy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import (
    EngineSettings,
    RoundEngine,
    RoundFailed,
    RoundOutcome,
    RunCancelledError,
)
from thrift_trainer.engine.tasks import Task
from thrift_trainer.engine.update_filters import NormLimit, UpdateFilter, relayed_filters
from thrift_trainer.engine.update_norms import RecentNorms
from thrift_trainer.training import aggregation, plugins
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.base import Algorithm, combine
from thrift_trainer.training.cancel import UnitCancelled
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.plugins import resolve as resolve_plugin
from thrift_trainer.training.run_check import RunUnfit
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.training.unit_parts import cast_like
from thrift_trainer.training.units import RELAY_MARK, UnitJob, UnitOutput, UnitSpec
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.version import check_protocol_version

log = logging.getLogger("compute_node.relay")


class RelayUnitFailed(RuntimeError):
    """A unit could not be computed on the relay's group; the message says why."""


class NoLiveHolder(RelayUnitFailed):
    """A client's unit, and no member that holds the client can take it now: the relay
    declines the unit (its member is away) rather than fail it."""


SLICE = RELAY_MARK  # a slice's id: <unit>~r<k>; each relay level adds one
MAX_LEVELS = 8  # deeper nesting is taken for a loop of relays
NORM_HISTORIES = 4  # runs whose recent update norms a relay keeps


def split_unit(unit: UnitSpec, parts: int) -> list[UnitSpec]:
    """``unit`` as up to ``parts`` contiguous slices of its index range (each one slice
    of the examples, ids ``<unit>~r<k>``), or whole when it has no range."""
    start, stop = unit.index_start, unit.index_stop
    if start is None or stop is None or parts < 2 or stop - start < 2:
        return [unit]
    parts = min(parts, stop - start)
    bounds = [start + (stop - start) * k // parts for k in range(parts + 1)]
    return [replace(unit, unit_id=f"{unit.unit_id}{SLICE}{k}", index_start=bounds[k],
                    index_stop=bounds[k + 1]) for k in range(parts)]


def check_depth(unit_id: str) -> None:
    """ValueError for a unit sliced by more relays than a sane tree has: relays that
    list each other would otherwise pass slices round for ever."""
    if unit_id.count(SLICE) >= MAX_LEVELS:
        raise ValueError(f"unit {unit_id} went through {MAX_LEVELS} relays: do relays list "
                         "each other? A relay's nodes file must not lead back to it")


class RelayRunner:
    """Computes units on a group of nodes (a UnitRunner of compute_node/handler.py)."""

    def __init__(self, nodes_file: NodesFile, policy: int, *,
                 engine: EngineSettings | None = None, rpc_timeout: float = 300.0,
                 connect_timeout: float = 3.0, seed: int | None = None) -> None:
        self.nodes_file = nodes_file
        self._timeouts = rpc_timeout, connect_timeout
        self.policy_number = policy
        self._policy = make_policy(policy, seed)
        self._engine = engine or EngineSettings()
        self._group: RunNodes | None = None
        self._heartbeats: HeartbeatMonitor | None = None
        # members that registered with the relay (pull nodes, or push nodes that announce
        # themselves), through its members port (compute_node/relay_members.py)
        self.membership = Membership()
        # node-resident clients: what the relay announces of its members' (relay_clients.py)
        self.member_clients = MemberClients()
        self._norms: OrderedDict[str, RecentNorms] = OrderedDict()  # by run, used last last
        self._norms_lock = threading.Lock()

    def start(self) -> int:
        """Read the group from the nodes file and start its heartbeats; returns how many
        members it has. NodesFileError when the file cannot be used (missing, bad, or
        naming this relay: tell `nodes_file.serve_at` the relay's address first)."""
        rpc_timeout, connect_timeout = self._timeouts
        self._group = RunNodes("relay", self.nodes_file.read(), rpc_timeout=rpc_timeout,
                               connect_timeout=connect_timeout,
                               suspect_seconds=SUSPECT_SECONDS, dead_seconds=DEAD_SECONDS,
                               nodes_source=self.nodes_file.read,
                               membership=self.membership)
        self._heartbeats = HeartbeatMonitor(lambda: list(self.members)).start()
        return len(self.members)

    def refresh(self) -> None:
        """Take in members added to the file or registered, drop those that left."""
        if self._group is not None:
            self._group.refresh()

    @property
    def members(self) -> list[NodeHandle]:
        return self._group.nodes if self._group is not None else []

    def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.stop()
        if self._group is not None:
            self._group.close()

    def __call__(self, algorithm: type[Algorithm], job: UnitJob, data_dir: Path) -> UnitOutput:
        if algorithm.uses_sessions:
            raise ValueError(f"{algorithm.name} keeps state on its nodes and cannot run "
                             "through a relay; list its nodes with the coordinator")
        check_depth(job.unit.unit_id)
        if self._group is None:
            raise RelayUnitFailed("the relay has not read its nodes file yet")
        self.refresh()  # members added to the file or registered (or gone) take part
        if job.unit.evaluates:
            return self._evaluate(job)
        if job.share is not None:  # a share from a relay above: one member computes it
            whole = [*member_shares(job.unit, 1)]  # one more "~r" level, as for any slice
            (result,) = self._round(job, whole, lambda unit, attempt: self._task(
                job, unit, attempt, job.weights, job.share)).results
            return UnitOutput(update=result.update, num_samples=result.num_samples,
                              loss=result.loss, error=0.0)
        rounds = local_rounds(job)
        if rounds > 1:
            return self._in_local_rounds(algorithm, job, rounds)
        # a client's unit is that client's data, held whole by its holders: never split
        slices = split_unit(job.unit, 1 if job.unit.client else len(self.members))
        outcome = self._round(job, slices, lambda unit, attempt: self._task(
            job, unit, attempt, job.weights))
        return UnitOutput(update=self._combined(job, outcome.results),
                          num_samples=sum(r.num_samples for r in outcome.results),
                          loss=outcome.train_loss, error=0.0)

    def _evaluate(self, job: UnitJob) -> UnitOutput:
        """Federated evaluation: the whole unit to one member that holds its client (its
        validation part is that member's), whose score goes up as it is: a score is no
        update, so nothing is split, combined or trained in local rounds."""
        whole = [*member_shares(job.unit, 1)]  # one more "~r" level, as for any slice
        outcome = self._round(job, whole, lambda unit, attempt: self._task(
            job, unit, attempt, job.weights), filters=[])
        if not outcome.results:  # no member holds the client, or none is alive
            raise RelayUnitFailed(f"no member of the relay holds client {job.unit.client} "
                                  f"to score it")
        (result,) = outcome.results
        return UnitOutput(update={}, num_samples=result.num_samples, loss=result.loss,
                          error=result.error)

    def _in_local_rounds(self, algorithm: type[Algorithm], job: UnitJob,
                         rounds: int) -> UnitOutput:
        """``rounds`` rounds over one share of the unit per member: each member trains
        from the group's weights, the relay adds the average of their deltas to them; the
        update is the group's whole change (hierarchical FedAvg)."""
        shares = member_shares(job.unit, self._sharers(job.unit))
        weights = job.weights
        for _ in range(rounds):
            outcome = self._round(job, list(shares), functools.partial(
                self._share_task, job, weights, shares))
            results = [r for r in outcome.results if r.num_samples > 0]  # empty shares
            step = self._combined(job, results)
            stepped = algorithm.add_update(weights, step)
            weights = {name: cast_like(value, weights[name].dtype)
                       for name, value in stepped.items()}
        change = algorithm.update_between(job.weights, weights, step)
        return UnitOutput(update={name: cast_like(value, _dtype_of(name, job.weights))
                                  for name, value in change.items()},
                          num_samples=sum(r.num_samples for r in results),
                          loss=outcome.train_loss, error=0.0)

    def live_holders(self, client: str) -> int:
        """How many members that hold ``client`` are alive (a silent one is suspect after
        a few seconds, as the coordinator's nodes are)."""
        return sum(1 for member in self.members if member.holds(client)
                   and member.liveness.state() == "alive")

    def ready_holders(self, client: str) -> int:
        """How many members that hold ``client`` can take its unit now: alive, and not
        benched after a failure (a member that just crashed is benched before it is
        suspect)."""
        now = runtime.monotonic()
        return sum(1 for member in self.members if member.holds(client)
                   and member.liveness.state() == "alive" and member.benched_until() <= now)

    def _sharers(self, unit: UnitSpec) -> int:
        """How many members share a unit in local rounds: all of them, or for a client's
        unit its live holders (only they hold its data; the engine sends them its shares)."""
        if unit.client is None:
            return len(self.members)
        return max(1, self.live_holders(unit.client))

    def _round(self, job: UnitJob, units: list[UnitSpec],
               build: Callable[[UnitSpec, int], Task],
               filters: list[UpdateFilter] | None = None) -> RoundOutcome:
        """One round of the relay's engine over ``units``, every one of them needed; the
        members' results checked by ``filters`` (by default the run's update checks)."""
        engine = RoundEngine(job.run_id, self.members, self._policy, self._engine,
                             RunProgress(job.run_id, 1, len(units), lambda: []),
                             job.control.cancelled)
        try:
            outcome = engine.run_round(job.round, units, len(units), build,
                                       self._filters(job) if filters is None else filters)
        except RunCancelledError:
            raise UnitCancelled("unit cancelled") from None
        except RoundFailed as exc:
            raise RelayUnitFailed(f"the relay's group could not compute unit "
                                  f"{job.unit.unit_id}: {exc}") from None
        if outcome.failures:
            reasons = "; ".join(f"{f.unit.unit_id}: {f.reason}" for f in outcome.failures)
            raise RelayUnitFailed(f"slices of unit {job.unit.unit_id} failed: {reasons}")
        if outcome.dropped:  # a client's unit, and no member holding it is alive
            raise NoLiveHolder(f"no live member of the relay holds client "
                               f"{job.unit.client} (unit {job.unit.unit_id})")
        return outcome

    def _filters(self, job: UnitJob) -> list[UpdateFilter]:
        """The checks of the members' results for ``job`` (engine/update_filters.py)."""
        codec = spec_of(job).compression.up
        norm_limit = NormLimit(self._engine.max_update_norm, self._recent_norms(job.run_id))
        return relayed_filters(job.expected_update, job.weights, codec, norm_limit)

    def _recent_norms(self, run_id: str) -> RecentNorms:
        """The run's recent update norms, shared by its units' rounds (that run at once)."""
        with self._norms_lock:
            recent = self._norms.pop(run_id, None) or RecentNorms()
            self._norms[run_id] = recent
            while len(self._norms) > NORM_HISTORIES:
                self._norms.popitem(last=False)
            return recent

    @staticmethod
    def _combined(job: UnitJob, results: list) -> dict:
        """The results combined by the run's aggregation rule, weighted by samples; the
        mean is folded in float64, and the update goes up as the members sent theirs."""
        dtypes = {name: value.dtype for name, value in results[0].update.items()}
        return {name: cast_like(value, dtypes[name])
                for name, value in combine(_rule(job.config), results).items()}

    def _share_task(self, job: UnitJob, weights: dict,
                    shares: dict[UnitSpec, tuple[int, int] | None], unit: UnitSpec,
                    attempt: int) -> Task:
        return self._task(job, unit, attempt, weights, shares[unit])

    def _task(self, job: UnitJob, unit: UnitSpec, attempt: int, weights: dict,
              share: tuple[int, int] | None = None) -> Task:
        return Task(run_id=job.run_id, round=job.round, unit_id=unit.unit_id, attempt=attempt,
                    algorithm=job.algorithm, model=job.model, dataset=job.dataset,
                    unit_path=unit.unit_path, config_json=job.config_json,
                    weights=weights, scheduling_policy=self.policy_number,
                    index_start=unit.index_start, index_stop=unit.index_stop,
                    model_version=job.model_version, share=share,
                    expected_update=job.expected_update, client=unit.client,
                    kind=unit.kind)


def member_shares(unit: UnitSpec, members: int) -> dict[UnitSpec, tuple[int, int] | None]:
    """One share of ``unit`` per member, as (part, parts), under ids ``<unit>~r<k>`` (the
    whole unit, None, for a group of one)."""
    return {replace(unit, unit_id=f"{unit.unit_id}{SLICE}{k}"):
            (k, members) if members > 1 else None for k in range(members)}


def local_rounds(job: UnitJob) -> int:
    """The run's ``hierarchy.relay_local_rounds`` (1 when the request has no section)."""
    return spec_of(job).hierarchy.relay_local_rounds


def spec_of(job: UnitJob) -> RunSpec:
    """The job's run spec: as the node parsed it for the run, else parsed from the job."""
    if job.spec is not None:
        return job.spec
    return RunSpec.parse(job.algorithm, job.model, job.dataset, job.config_json)


def _dtype_of(name: str, weights: Mapping[str, np.ndarray]) -> np.dtype:
    """The dtype an update tensor goes up in: its weight's (a buffer's under its own name)."""
    weight = weights.get(name, weights.get(name.partition(".")[2]))
    return weight.dtype if weight is not None else np.dtype(np.float32)


def _expected_model(spec: RunSpec) -> str | None:
    """The coordinator's model fingerprint, which the members were checked against."""
    model = spec.expect.get("model")
    return model if isinstance(model, str) and model else None


def _role(members: int) -> str:
    return f"relay of {members} node{'s' if members != 1 else ''}"


def _rule(config: Mapping[str, object]) -> dict[str, object]:
    """The run's aggregation settings (checked), as the coordinator combines with them."""
    return aggregation.check_settings(config.get(aggregation.SECTION))


class RelayHandler(ComputeNodeHandler):
    """The ComputeNode service of a relay: admission and load as any node's, the maths on
    its group (`RelayRunner`), as many units at once as it has members."""

    def __init__(self, node_id: str, data_root: str | os.PathLike, load: LoadSimulator,
                 runner: RelayRunner) -> None:
        super().__init__(node_id, data_root, load)
        self.unit_runner = runner
        self.relay = runner

    def start_relay(self) -> int:
        """Read the group (see `RelayRunner.start`): as many units at once as members."""
        members = self.relay.start()
        self._count_members(members)
        return members

    def _count_members(self, members: int) -> None:
        """Take as many units at once as the group has members, and say so in pings."""
        if self.role != _role(members):
            self.allow_concurrent_units(max(1, members))
            self.role = _role(members)

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        """A node's answer, with the group's counts as the relay's engine keeps them (and
        theirs when members are relays), so the coordinator can show the tree."""
        self.relay.refresh()  # members that registered or left since
        self._count_members(len(self.relay.members))
        info = super().ping(request)
        for member in self.relay.members:  # a member relay's own group, as it is now
            member.refresh_group()
        info.members = [node_summary(member.summary()) for member in self.relay.members]
        return info

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        if self._holds(request.run_id, request.unit_id, request.attempt):
            # the very unit this relay is computing came back: its group leads back here
            raise ttypes.InvalidRequest(message=f"unit {request.unit_id} came back to the "
                                        f"relay {self.node_id} that sent it: relays list "
                                        "each other")
        if request.client is not None:
            self.relay.refresh()  # members that registered or left since
            if not self.relay.ready_holders(request.client):
                return self._declined(request)
        try:
            return super().train_with_weights(request)
        except NoLiveHolder:  # its holders went away while the unit was here
            return self._declined(request)

    def _declined(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        """A client's unit that no member can take now (each one holding it is silent or
        benched): declined as a busy node declines one, not failed, so the coordinator
        tries the client's other holders, and the client drops out of the round once the
        relay's next check no longer announces it."""
        self.counters.bump("rejected")
        log.info("unit %s round %d declined: no live member holds client %s",
                 request.unit_id, request.round, request.client)
        return unit_result(ttypes.UnitOutcome.REJECTED, self.node_id,
                           message=f"no live member of relay {self.node_id} holds client "
                                   f"{request.client}", version=request.model_version)

    def check_run(self, request: ttypes.RunCheckRequest) -> ttypes.RunCheck:
        """The relay holds the run's plug-ins (it combines its members' results) and at
        least one member can serve the run; the members say what they build."""
        check_protocol_version(request.protocol_version, "node")
        try:
            spec = RunSpec.parse(request.algorithm, request.model, request.dataset,
                                 request.config_json)
            self._check_fit(spec, Path())
        except (RunUnfit, ConfigError) as exc:
            return ttypes.RunCheck(ok=False, problem=str(exc), plugins=plugins.versions())
        self.relay.refresh()
        query = RunQuery(request.run_id, request.algorithm, request.model, request.dataset,
                         request.config_json)
        problems = node_problems(self.relay.members, query, spec.expect, spec)
        if self.relay.members and len(problems) == len(self.relay.members):
            reasons = "; ".join(f"{n.name} {reason}" for n, reason in problems.items())
            return ttypes.RunCheck(ok=False, plugins=plugins.versions(),
                                   problem=f"is a relay none of whose members can serve the "
                                           f"run: {reasons}")
        # members check the model and data themselves with every unit (its `expect`)
        answer = ttypes.RunCheck(ok=True, plugins=plugins.versions())
        if not spec.clients.on_nodes:
            return answer
        fit = [member for member in self.relay.members if member not in problems]
        return announced(answer, self.relay.member_clients.gather(request.run_id, fit),
                         _expected_model(spec))

    def _check_fit(self, spec: RunSpec, location: Path) -> None:
        """A relay needs the run's plug-ins, not the data: its members compute, and check
        their model and data against the unit's ``expect`` themselves."""
        try:
            for kind, name in spec.named_plugins:
                resolve_plugin(name, kind)
            get_algorithm(spec.algorithm).check_config(spec.model, spec.algorithm_config())
        except PluginError as exc:
            raise RunUnfit(str(exc)) from None

    def _check_unit_file(self, unit_file: Path) -> None:
        """The members read the data; the relay needs only the data set's folder."""

    def _check_holds(self, client: str | None, spec: RunSpec, location: Path) -> None:
        """A relay holds its members' clients: its engine sends a client's unit only to a
        member that holds it, and the relay declines the unit when none of them can take
        it now (`train_with_weights`)."""
