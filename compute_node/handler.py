"""The ComputeNode Thrift service: admission, load delay, then the algorithm's unit maths."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.run_configs import CheckedRun, RunConfigs
from thrift_trainer.compute_node.secure_clients import SecureClients
from thrift_trainer.compute_node.session_service import SessionService
from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.compute_node.warm_up import WarmUp
from thrift_trainer.compute_node.weight_cache import WeightCache
from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.clients.held import HeldClients
from thrift_trainer.training.clients.settings import client_index
from thrift_trainer.training.compression import CompressionSettings, compress_update, decompress
from thrift_trainer.training.data.letters import DataFormatError
from thrift_trainer.training.data.paths import DataPathError, data_location, resolve_under
from thrift_trainer.training.payload_checks import PayloadForm, check_payload
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.run_check import RunFacts, RunUnfit, run_facts, unfit_reason
from thrift_trainer.training.secure_aggregation import messages as secure_messages
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.training.units import EVALUATE, TRAIN, UNIT_KINDS, UnitJob, UnitOutput, UnitSpec
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import CodecError, dict_to_wire, specs_from_wire, wire_to_dict
from thrift_trainer.wire.version import check_protocol_version

log = logging.getLogger("compute_node")

# Errors that mean "the request cannot work here": the caller gets InvalidRequest.
REQUEST_ERRORS = (ConfigError, DataPathError, DataFormatError, CodecError, PluginError,
                  ValueError)


UnitRunner = Callable[[type[Algorithm], UnitJob, Path], UnitOutput]
Tensors = dict[str, np.ndarray]


MAX_SHARES = 1024


def run_unit(algorithm: type[Algorithm], job: UnitJob, data_dir: Path) -> UnitOutput:
    """A unit's maths: the algorithm's node half, or the share of it the job names. An
    empty share (more shares than rows) is an answer of no samples."""
    if job.share is None:
        return algorithm.run_unit(job, data_dir)
    if not algorithm.splits_units:
        raise ConfigError(f"{algorithm.name} units cannot be split into shares")
    output = algorithm.run_unit_part(job, data_dir, *job.share)
    return output or UnitOutput(update={}, num_samples=0, loss=0.0, error=0.0)


def share_of(request: ttypes.WorkRequest) -> tuple[int, int] | None:
    """The (part, parts) a request asks for, checked; None for the whole unit."""
    if request.part is None and request.parts is None:
        return None
    part, parts = request.part, request.parts
    if part is None or parts is None or not (2 <= parts <= MAX_SHARES and 0 <= part < parts):
        raise ValueError(f"a share needs part in 0..parts-1 and parts in 2..{MAX_SHARES}, "
                         f"got part {part!r} of {parts!r}")
    return part, parts


@dataclass
class NodeCounters:
    completed: int = 0
    rejected: int = 0
    cancelled: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, name: str, by: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + by)


class ComputeNodeHandler(SessionService):
    """Implements ComputeNode.Iface. Several units may wait in their load delay at
    once, but their maths runs one at a time (a lock), so a node uses one core.
    Per-run sessions (MD-GAN's discriminators) live in ``self.sessions``.
    ``unit_runner`` runs a unit's maths; fault injection (compute_node/faults.py) swaps it."""

    def __init__(
        self,
        node_id: str,
        data_root: str | os.PathLike,
        load: LoadSimulator,
        device: str = "cpu",
    ) -> None:
        self.node_id = node_id
        self.data_root = Path(data_root)
        self.sessions = SessionStore()
        self.weights = WeightCache()  # weights of earlier units, for `weights_cached`
        self.runs = RunConfigs(self._checked_run)  # each run parsed and checked once
        self.load = load
        self.unit_runner: UnitRunner = run_unit
        self.link_delay = 0.0  # seconds every reply is held (--link-delay-ms, experiments)
        self._delaying: set[tuple[str, str, int]] = set()  # units in their load delay
        self.device = device
        self.counters = NodeCounters()
        self.started = time.monotonic()
        self._compute_lock = threading.BoundedSemaphore(1)  # a node computes one unit
        self._active: dict[tuple[str, str, int], UnitControl] = {}
        self._active_lock = threading.Lock()
        self._batches_done = 0  # batches of the units that have left the node
        self.warm_up = WarmUp(device)
        # What computes the units when not this process alone (the coordinator's node
        # table shows it): a relay's group, local workers.
        self.role: str | None = None
        # The federated clients whose data this node holds (--clients); None: every one.
        self.held_clients: HeldClients | None = None
        # Node-resident clients: whether its run checks leave out its label counts.
        self.private_label_counts = False
        self.secure = SecureClients()  # its clients' secrets in secure rounds

    # ---------------------------------------------------------------- service
    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        result = self._answer(request)
        if self.link_delay:  # an experiment's slow link: every reply is held
            time.sleep(self.link_delay)
        return result

    def _answer(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        check_protocol_version(request.protocol_version, "node")
        if request.kind in secure_messages.PHASES:
            return self._secure_phase(request)
        try:
            decoded = self._decode(request)
        except RunUnfit as exc:
            log.warning("unit %s of run %s: this node cannot serve the run: %s",
                        request.unit_id, request.run_id, exc)
            return unit_result(ttypes.UnitOutcome.UNFIT, self.node_id, message=str(exc),
                               version=request.model_version)
        if decoded is None:
            log.info("unit %s round %d: weights of version %d not held, asked for them",
                     request.unit_id, request.round, request_version(request))
            return unit_result(ttypes.UnitOutcome.NEED_WEIGHTS, self.node_id,
                               message="weights not held: send them",
                               version=request.model_version)
        algorithm, job, data_dir, compression, sent = decoded
        admission = self._admit(request.scheduling_policy)
        if admission.rejected:
            self.counters.bump("rejected")
            log.info("unit %s round %d rejected (simulated load)", job.unit.unit_id, job.round)
            return unit_result(ttypes.UnitOutcome.REJECTED, self.node_id, message="node busy",
                               version=request.model_version)
        log.info("unit %s round %d accepted%s", job.unit.unit_id, job.round,
                 f", waiting {admission.delay_seconds:g}s (simulated load)"
                 if admission.delay_seconds else "")
        key = (request.run_id, request.unit_id, request.attempt)
        control = self._register(key)
        try:
            result = self._work(algorithm, replace(job, control=control), data_dir,
                                admission.delay_seconds, key, compression)
            result.model_version = request.model_version
        finally:
            self._unregister(key)
        if sent is not None and result.outcome == ttypes.UnitOutcome.COMPLETED:
            # Kept only once a unit's maths took them: weights that do not fit the model
            # never stay (before the answer, so a reference that follows finds them).
            self.weights.put(request.run_id, request_version(request), compression.down, sent)
        if request.secure_aggregation is not None \
                and result.outcome == ttypes.UnitOutcome.COMPLETED:
            result.update = self._masked(request, job.spec, result.update)
        return result

    def _secure_phase(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        """A phase of a client's secure round (compute_node/secure_clients.py): no data,
        no model, no simulated load (a few key operations)."""
        started = time.perf_counter()
        try:
            run = self.runs.checked(request)
            if request.client is None:
                raise ValueError("a secure-aggregation phase names its client")
            self._check_holds(request.client, run.spec, run.location)
            settings = run.spec.secure_aggregation
            if not settings.enabled:
                raise ValueError(f"run {request.run_id} has no secure_aggregation section")
            answer = self.secure.phase(request.kind, request.run_id, request.round,
                                       request.client, request.secure_aggregation, settings)
        except RunUnfit as exc:
            return unit_result(ttypes.UnitOutcome.UNFIT, self.node_id, message=str(exc),
                               version=request.model_version)
        except REQUEST_ERRORS as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc
        result = unit_result(ttypes.UnitOutcome.COMPLETED, self.node_id,
                             seconds=time.perf_counter() - started,
                             version=request.model_version)
        result.secure_aggregation = answer
        return result

    def _masked(self, request: ttypes.WorkRequest, spec: RunSpec,
                update: list[ttypes.Tensor]) -> list[ttypes.Tensor]:
        """A client's update as its secure round sends it: quantised and masked."""
        try:
            masked = self.secure.mask(request.run_id, request.round, request.client or "",
                                      request.secure_aggregation, wire_to_dict(update),
                                      spec.secure_aggregation, spec.privacy)
        except REQUEST_ERRORS as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc
        return dict_to_wire(masked)

    def cancel_unit(self, request: ttypes.CancelUnitRequest) -> ttypes.CancelUnitResult:
        cancelled = 0
        with self._active_lock:
            for (run_id, unit_id, attempt), control in self._active.items():
                same_attempt = request.attempt is None or request.attempt == attempt
                if run_id == request.run_id and unit_id == request.unit_id and same_attempt:
                    control.cancel()  # its maths stops before its next batch
                    cancelled += 1
        return ttypes.CancelUnitResult(cancelled=cancelled)

    def allow_concurrent_units(self, count: int) -> None:
        """Let ``count`` units' maths run at once from now on (a unit already computing
        releases the lock it took: ``with`` holds that object)."""
        self._compute_lock = threading.BoundedSemaphore(count)

    def _holds(self, run_id: str, unit_id: str, attempt: int) -> bool:
        """Whether this attempt of the unit is in the node's hands right now."""
        with self._active_lock:
            return (run_id, unit_id, attempt) in self._active

    def cancel_all(self) -> None:
        """On shutdown: units waiting in a load delay answer 'cancelled' at once."""
        with self._active_lock:
            for control in self._active.values():
                control.cancel()

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        check_protocol_version(request.protocol_version, "node")
        if request.warm_up:
            problem = self.warm_up.start(request.warm_up)
            if problem:  # one template: the log folds a flood of them into a count
                log.warning("a ping asked this node to warm up for a model it cannot build, "
                            "refused: %s", problem)
        c = self.counters
        with c.lock:
            return ttypes.NodeInfo(
                protocol_version=PROTOCOL_VERSION,
                node_id=self.node_id,
                load_prob=self.load.load_prob,
                units_running=c.running,
                units_completed=c.completed,
                units_rejected=c.rejected,
                uptime_seconds=time.monotonic() - self.started,
                delaying=self.delaying(),
                progress=self.progress(),
                warming_up=self.warm_up.busy,
                role=self.role,
            )

    def delaying(self) -> list[str]:
        """Units waiting in their simulated load delay, as "run_id/unit_id/attempt": the
        coordinator does not count that wait against a unit's deadline."""
        with self._active_lock:
            return [f"{r}/{u}/{a}" for r, u, a in sorted(self._delaying)]

    def progress(self) -> dict[str, int]:
        """Every unit the node holds ("run_id/unit_id/attempt") with the batches the node
        has done so far. The count grows while the unit works and while the units ahead of
        it at the compute lock do: either way the unit is on its way, not lost."""
        with self._active_lock:
            total = self._batches_done + sum(c.batches for c in self._active.values())
            return {f"{r}/{u}/{a}": total for r, u, a in self._active}

    # ---------------------------------------------------------------- helpers
    def _decode(self, request: ttypes.WorkRequest):
        """(algorithm, job, data location, compression, the weights as sent or None when
        they came from the cache) of the request; None when it refers to kept weights that
        this node does not hold."""
        try:
            run = self.runs.checked(request)
            if request.unit_path:  # a unit that is a file of the data set (not a range)
                self._check_unit_file(resolve_under(run.location, request.unit_path))
            unit = UnitSpec(request.unit_id, request.unit_path, request.index_start,
                            request.index_stop, client=request.client,
                            kind=unit_kind(request))
            self._check_holds(unit.client, run.spec, run.location)
            share = share_of(request)
            expected = None if request.expected_update is None \
                else specs_from_wire(request.expected_update)
            weights = self._weights_of(request, run.spec.compression,
                                       run.algorithm.writes_weights(request.model))
        except RunUnfit:
            raise
        except REQUEST_ERRORS as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc
        if weights is None:
            return None
        own, sent = weights
        job = UnitJob(request.run_id, request.round, unit, request.model, run.given,
                      own, device=self.device,
                      sessions=self.sessions, algorithm=request.algorithm,
                      dataset=request.dataset, config_json=request.config_json or "",
                      model_version=request.model_version, share=share,
                      expected_update=expected, checked_config=run.config, spec=run.spec)
        return run.algorithm, job, run.location, run.spec.compression, sent

    def _checked_run(self, request: ttypes.WorkRequest) -> CheckedRun:
        """The request's run parsed and checked: what a node does for a run's first unit
        (`RunConfigs` keeps it for the others). RunUnfit when this node cannot serve the
        run; the request's own errors otherwise."""
        spec = RunSpec.parse(request.algorithm, request.model, request.dataset,
                             request.config_json)
        location = data_location(self.data_root, request.dataset)
        self._check_fit(spec, location)
        algorithm = get_algorithm(spec.algorithm)
        given = spec.algorithm_config()
        return CheckedRun(spec, algorithm, given, algorithm.check_config(request.model, given),
                          location)

    def check_run(self, request: ttypes.RunCheckRequest) -> ttypes.RunCheck:
        """Whether this node can serve the run, with its plug-ins and fingerprints."""
        check_protocol_version(request.protocol_version, "node")
        try:
            spec = RunSpec.parse(request.algorithm, request.model, request.dataset,
                                 request.config_json)
            facts = run_facts(spec, data_location(self.data_root, request.dataset))
        except (RunUnfit, ConfigError, DataPathError) as exc:
            return ttypes.RunCheck(ok=False, problem=str(exc), plugins=plugins.versions())
        answer = ttypes.RunCheck(ok=True, plugins=facts.plugins,
                                 model_fingerprint=facts.model_fingerprint or None,
                                 data_fingerprint=facts.data_fingerprint or None,
                                 data_size=facts.data_size or None,
                                 partition_fingerprint=facts.partition or None,
                                 clients=self._held_names(spec, facts))
        if spec.clients.on_nodes:  # its own data is its clients: names and sizes, no data
            answer.client_sizes = self._own_named(facts.own_sizes)
            answer.client_fingerprints = self._own_named(facts.own_fingerprints)
            if not self.private_label_counts:
                answer.client_labels = {name: json.dumps(counts) for name, counts in
                                        self._own_named(facts.own_labels).items()
                                        if counts is not None}
        return answer

    def _own_named(self, by_client: dict[str, Any]) -> dict[str, Any]:
        """A node-resident fact by client name: a data set that is one client is named by
        this node's id."""
        return {name or self.node_id: value for name, value in by_client.items()}

    def _held_names(self, spec: RunSpec, facts: RunFacts) -> list[str] | None:
        """The run's clients this node holds, when only some; None: every one."""
        if spec.clients.on_nodes:
            return list(self._own_named(facts.own_sizes))
        if self.held_clients is None or not spec.clients.enabled:
            return None
        return self.held_clients.names(spec.clients.count)

    def _check_fit(self, spec: RunSpec, location: Path) -> None:
        """RunUnfit unless this node builds what the coordinator built (a unit's
        ``expect``), and holds every plug-in the run names."""
        if not (spec.expect or spec.plugin_names):
            return
        reason = unfit_reason(spec.expect, run_facts(spec, location), spec)
        if reason:
            raise RunUnfit(reason)

    def _check_holds(self, client: str | None, spec: RunSpec, location: Path) -> None:
        """A node computes only the clients whose data it holds."""
        if client is None:
            return
        if spec.clients.on_nodes:
            own = self._own_named(run_facts(spec, location).own_sizes)
            if client not in own:
                names = ", ".join(sorted(own)[:5]) + (", ..." if len(own) > 5 else "")
                raise DataPathError(f"node {self.node_id} holds only its own clients "
                                    f"({names}), not {client}")
            return
        if self.held_clients is None:
            return
        if client_index(client, spec.clients.count) not in self.held_clients:
            raise DataPathError(f"node {self.node_id} does not hold {client} (it holds "
                                f"clients {self.held_clients})")

    def _check_unit_file(self, unit_file: Path) -> None:
        """A node computes on its own copy of the data: the unit's file must be there."""
        if not unit_file.is_file():
            raise DataPathError(f"unit file {unit_file} does not exist on node {self.node_id}")

    def _weights_of(self, request: ttypes.WorkRequest, compression: CompressionSettings,
                    writable: bool) -> tuple[Tensors, Tensors | None] | None:
        """(the unit's weights, the weights as sent): decoded from the request, whose codec
        must be the run's (checked before anything is decoded), or, for a request that says
        `weights_cached` and carries none, the kept ones, with None as sent; the unit's
        are its own copies when it may change them (`writable`), else read-only views. None
        when kept weights are asked for and not held."""
        if request.weights_cached and not request.weights:
            kept = self.weights.get(request.run_id, request_version(request),
                                    compression.down, writable)
            return None if kept is None else (kept, None)
        payload = wire_to_dict(request.weights)
        check_payload(payload, PayloadForm(compression.down))
        sent = decompress(payload)
        if not writable:
            return sent, sent
        return {name: value.copy() for name, value in sent.items()}, sent

    def _admit(self, policy: int):
        try:
            return self.load.admit(policy)
        except ValueError as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc

    def _work(self, algorithm, job: UnitJob, data_dir: Path, delay: float,
              key: tuple[str, str, int], compression: CompressionSettings) -> ttypes.TrainResult:
        cancel = job.control.cancelled
        self.counters.bump("running")
        waited = 0.0
        try:
            # The simulated load delay is cancellable, so a unit that another node
            # finished first does not keep this node's thread for nothing.
            if delay:
                began = time.perf_counter()
                interrupted = self._wait_delay(key, cancel, delay)
                waited = time.perf_counter() - began
                if interrupted:
                    return self._cancelled(waited)
            with self._compute_lock:
                if cancel.is_set():
                    return self._cancelled(waited)
                started = time.perf_counter()
                try:
                    output = self._run(algorithm, job, data_dir)
                except UnitCancelled:
                    log.info("unit %s round %d cancelled after %d batches", job.unit.unit_id,
                             job.round, job.control.batches)
                    return self._cancelled(waited)
                seconds = time.perf_counter() - started
            # Encoded for the wire last, as a node sends whatever its maths produced (an
            # evaluation unit has no update, and must not touch a residual).
            if not job.unit.evaluates:
                output = replace(output, update=compress_update(
                    output.update, compression, job.sessions, job.run_id,
                    algorithm.unit_slot(job.unit, job.config), job.round))
        finally:
            self.counters.bump("running", -1)
        self.counters.bump("completed")
        log.info("unit %s round %d done: %d samples in %.3fs", job.unit.unit_id, job.round,
                 output.num_samples, seconds)
        return unit_result(ttypes.UnitOutcome.COMPLETED, self.node_id, output, seconds, waited)

    def _wait_delay(self, key: tuple[str, str, int], cancel: threading.Event,
                    delay: float) -> bool:
        with self._active_lock:
            self._delaying.add(key)
        try:
            return cancel.wait(delay)
        finally:
            with self._active_lock:
                self._delaying.discard(key)

    def _run(self, algorithm, job: UnitJob, data_dir: Path) -> UnitOutput:
        try:
            return self.unit_runner(algorithm, job, data_dir)
        except REQUEST_ERRORS as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from exc

    def _cancelled(self, delay: float) -> ttypes.TrainResult:
        self.counters.bump("cancelled")
        return unit_result(ttypes.UnitOutcome.CANCELLED, self.node_id, delay=delay,
                           message="cancelled by the coordinator")

    def _register(self, key: tuple[str, str, int]) -> UnitControl:
        control = UnitControl()
        with self._active_lock:
            self._active[key] = control
        return control

    def _unregister(self, key: tuple[str, str, int]) -> None:
        with self._active_lock:
            control = self._active.pop(key, None)
            if control is not None:
                self._batches_done += control.batches


def unit_kind(request: ttypes.WorkRequest) -> str:
    """The request's kind of unit (absent: train); ValueError for one this node lacks."""
    kind = request.kind or TRAIN
    if kind not in UNIT_KINDS:
        raise ValueError(f"unknown kind of unit {kind!r}; known: {', '.join(UNIT_KINDS)}")
    if kind == EVALUATE and request.client is None:
        raise ValueError("an evaluation unit names the client whose validation part it scores")
    return kind


def request_version(request: ttypes.WorkRequest) -> int:
    """The model version of a request's weights: its own field, else round - 1 (a sync
    round's weights), as engine.tasks.Task.version."""
    return request.round - 1 if request.model_version is None else request.model_version


def unit_result(outcome: int, node_id: str, output: UnitOutput | None = None,
                seconds: float = 0.0, delay: float = 0.0, message: str | None = None,
                version: int | None = None) -> ttypes.TrainResult:
    """A unit's answer on the wire: its outcome, and the output where it has one."""
    return ttypes.TrainResult(
        accepted=outcome == ttypes.UnitOutcome.COMPLETED,
        outcome=outcome,
        update=dict_to_wire(output.update) if output else [],
        num_samples=output.num_samples if output else 0,
        loss=output.loss if output else 0.0,
        error=output.error if output else 0.0,
        compute_seconds=seconds,
        delay_seconds=delay,
        message=message,
        node_id=node_id,
        model_version=version,
        loss_before=output.loss_before if output else None,
    )
