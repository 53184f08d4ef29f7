"""A train request checked once, before any run exists: its spec, algorithm and outputs.

`prepare` reads the request's fields into the typed spec (training/spec.py), checks them
against this coordinator's limits (coordinator/request_checks.py) and the algorithm's
abilities (schedules, local rounds, codecs), builds the algorithm (which loads the data
set and, for a torch model, builds the model and runs it once on a few examples; a private
run's gets its secret noise key, training/privacy/noise_key.py) and returns everything the
run loop needs. Every refusal is an InvalidRun naming the field,
key or plug-in at fault, so the client hears of it before round 1, with exit status 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from thrift_trainer.coordinator.records import InvalidRun, RunRequest
from thrift_trainer.coordinator.request_checks import (
    RequestLimits,
    check_config,
    check_fields,
    check_model_bytes,
    check_units,
)
from thrift_trainer.engine import runtime
from thrift_trainer.training import hierarchy, schedule
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.compression import check_supported
from thrift_trainer.training.data.letters import DataFormatError
from thrift_trainer.training.data.paths import DataPathError, data_location
from thrift_trainer.training.models.names import check_model_name, is_module_model
from thrift_trainer.training.outputs.plots import check_outputs
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.privacy import accounting, noise_key
from thrift_trainer.training.run_check import RunFacts, RunUnfit, run_facts
from thrift_trainer.training.spec import RunSpec

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class RunSetup:
    """A checked request: what the run loop is built from."""

    run_id: str
    request: RunRequest
    spec: RunSpec
    algorithm: Algorithm
    outputs: dict[str, int]
    node_config_json: str  # the config every unit carries, defaults filled in
    units_per_round: int  # what the algorithm plans per (sync) round
    # What this coordinator built of a run with plug-ins or a torch model, for the nodes to
    # be checked against before round 1 (None: a built-in run, nothing to check).
    facts: RunFacts | None = None


def prepare(request: RunRequest, data_root: Path, limits: RequestLimits,
            deterministic: bool, weights_dirs: Sequence[Path] = ()) -> RunSetup:
    """The checked request; InvalidRun says what is wrong. `run.init_weights` is read
    only from the data root and ``weights_dirs`` (the run folders, --weights-dir)."""
    run_id = check_run_id(request.run_id)
    check_fields(request, limits)
    try:
        spec = RunSpec.parse(request.algorithm, request.model, request.dataset,
                             request.config_json)
        check_init_weights(spec.model_settings.init_weights, (data_root, *weights_dirs))
        algorithm = _algorithm(spec, data_root, limits, deterministic)
        _check_budget(algorithm, request.rounds)
    except (ConfigError, DataPathError, DataFormatError, PluginError) as exc:
        raise InvalidRun(_refused_here(str(exc))) from None
    except OSError as exc:  # e.g. a name the file system refuses
        raise InvalidRun(f"dataset: {exc.strerror or exc}") from None
    check_model_bytes(sum(w.nbytes for w in algorithm.initial_weights().values()), limits)
    planned = algorithm.units_per_round()
    check_units(planned, limits)
    facts = _facts(spec, data_root)
    if facts is not None:
        spec = replace(spec, expect=facts.expectation())
    outputs = _outputs(request.outputs_json)
    if spec.privacy.enabled and outputs.get("checkpoint_every", 1) != 1:
        # a round's weights leave the coordinator only after its checkpoint, so a resume
        # never computes again a round whose noised weights were released
        raise InvalidRun("privacy: outputs.checkpoint_every must be 1 (each round's noised "
                         "weights are checkpointed before they are sent out)")
    return RunSetup(run_id, request, spec, algorithm, outputs,
                    spec.to_config_json(algorithm.config), planned, facts)


def _facts(spec: RunSpec, data_root: Path) -> RunFacts | None:
    """The coordinator's facts of a run that names plug-ins, trains a torch model or has
    federated clients (its nodes must say which clients they hold before round 1)."""
    if not (spec.plugin_names or is_module_model(spec.model) or spec.clients.enabled):
        return None
    try:
        return run_facts(spec, data_location(data_root, spec.dataset))
    except RunUnfit as exc:
        raise InvalidRun(_refused_here(str(exc).removeprefix("cannot serve the run: "))) \
            from None


def _refused_here(message: str) -> str:
    """A refusal said to the client names the process that refuses: the coordinator
    lacking a plug-in is told apart from a node that does (whose line names it)."""
    return f"the coordinator {message}" if message.startswith("lacks ") else message


def check_init_weights(path: str, allowed: Sequence[Path]) -> None:
    """Starting weights only from the folders the operator allowed, the path resolved
    (symbolic links too); a path outside gets one answer whether it exists or not, so that
    the request cannot tell which files the coordinator has."""
    if not path:
        return
    try:
        resolved = Path(path).resolve()
        inside = any(resolved.is_relative_to(folder.resolve()) for folder in allowed)
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL in the name
        inside = False
    if not inside:
        raise InvalidRun(f"run.init_weights {path} is not in a folder this coordinator "
                         "allows (its data root, its run folders, --weights-dir); place the "
                         "file in one, or start the coordinator with --weights-dir DIR")


def weights_folders(values: Sequence[str]) -> tuple[Path, ...]:
    """--weights-dir's folders, each value one folder or a comma-separated list."""
    return tuple(Path(part.strip()) for value in values for part in value.split(",")
                 if part.strip())


def check_run_id(run_id: str) -> str:
    if not RUN_ID.match(run_id or ""):
        raise InvalidRun(f"run id {run_id!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return run_id


def _algorithm(spec: RunSpec, data_root: Path, limits: RequestLimits,
               deterministic: bool) -> Algorithm:
    """The spec's algorithm, its settings checked against the limits and its abilities
    before it builds anything (a model, a plan) from them."""
    try:
        check_model_name(spec.model)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None
    if not is_module_model(spec.model) and (spec.model_settings.changed() or spec.data.changed()):
        raise ConfigError(f"run.model_args, loss, metric, init_weights, the training loop's "
                          f"keys (lr_schedule, clip_norm, ...) and the data section "
                          f"are for torch models (mlp_classifier or a plug-in "
                          f"module:attribute), not {spec.model!r}")
    cls = get_algorithm(spec.algorithm)
    hierarchy.check_usable(spec.hierarchy, cls)
    check_supported(spec.compression, cls.name, cls.compression_codecs(spec.model))
    schedule.check_usable(spec.schedule, cls, deterministic)
    _check_clients(spec, cls)
    _check_privacy(spec, cls)
    _check_secure_aggregation(spec, cls)
    if spec.schedule.asynchronous and spec.compression.keeps_residuals:
        # residuals are kept per unit slot, and a stream's units change with every pass
        raise ConfigError(f"compression.up: topk cannot be used in {spec.schedule.mode!r} "
                          "mode (it can: fp16, int8)")
    config = spec.algorithm_config()
    check_config(cls.check_config(spec.model, config), limits)
    algorithm = cls(spec.model, config, data_location(data_root, spec.dataset), spec.dataset)
    if spec.privacy.enabled:  # the coordinator's secret: its noise and draws are keyed by it
        key = runtime.secret(noise_key.LABEL, noise_key.KEY_BYTES)
        algorithm.use_noise_key(key)  # type: ignore[attr-defined]
    if spec.privacy.enabled and spec.schedule.mode == "buffered":
        algorithm.release_buffers(spec.schedule.buffer_size)  # type: ignore[attr-defined]
    return algorithm


def _check_clients(spec: RunSpec, cls: type[Algorithm]) -> None:
    """ConfigError, in one line, for a run with clients that cannot have them."""
    if not spec.clients.enabled:
        return
    problem = cls.takes_clients(spec.model)
    if problem is None and spec.clients.eval_every and not _overrides(cls, "evaluation_units"):
        problem = (f"eval_every: {cls.name} does not score clients' validation parts "
                   f"(delta_avg does); leave eval_every at 0")
    if problem is None and spec.schedule.asynchronous:
        problem = _stream_problem(spec, cls)
    if problem is not None:
        raise ConfigError(f"clients: {problem}")


def _check_privacy(spec: RunSpec, cls: type[Algorithm]) -> None:
    """ConfigError, in one line, for a private run that DP-FedAvg cannot make private: its
    sensitivity bound holds for the plain sum of clipped updates of clients sampled in sync
    rounds, or of a buffer's clients in buffered mode, one release a round (compression
    composes: the coordinator clips what it decoded)."""
    if not spec.privacy.enabled:
        return
    problem = None
    if not cls.private:
        problem = f"{cls.name} has no client-level privacy (delta_avg has)"
    elif not spec.clients.enabled:
        problem = "client-level privacy needs federated clients (set clients.count)"
    elif spec.aggregation_rule != "mean":
        problem = (f"aggregation.rule {spec.aggregation_rule} does not sum the clipped "
                   f"updates, which the noise is calibrated to; use mean")
    elif spec.clients.eval_every:
        # a resume forgets what came after the last checkpoint, and the evaluation would
        # have sent the round's model out before it
        problem = ("clients.eval_every sends each round's model to the nodes before the "
                   "round is recorded, which a crash could turn into a release the budget "
                   "misses; leave it at 0")
    elif spec.clients.over_select != 1:
        problem = ("clients.over_select drops the late clients of a round, which the "
                   "accounting of the sampling cannot see; leave it at 1")
    elif spec.schedule.mode == "async":
        problem = ("async mode makes a version of every single result; use sync rounds, "
                   "or buffered mode with schedule.updates_per_round 1")
    elif spec.schedule.mode == "buffered" and spec.schedule.updates_per_round != 1:
        # each buffer is a release, which must be checkpointed before it is sent out
        problem = ("buffered mode needs schedule.updates_per_round 1 (each noised version "
                   "is a round, checkpointed before it leaves the coordinator)")
    elif (spec.schedule.mode == "buffered" and not spec.clients.on_nodes
          and spec.clients.count < spec.schedule.buffer_size):
        # a client counts at most once in a buffer: fewer clients could never fill one
        problem = (f"schedule.buffer_size {spec.schedule.buffer_size} needs as many "
                   f"clients (clients.count {spec.clients.count}): a client counts at most "
                   f"once in a buffer")
    if problem is not None:
        raise ConfigError(f"privacy: {problem}")


def _check_secure_aggregation(spec: RunSpec, cls: type[Algorithm]) -> None:
    """ConfigError, in one line, for a run whose rounds cannot be securely aggregated: the
    coordinator gets one masked sum a round (coordinator/secure_rounds.py), so only the
    plain mean of clients' deltas in sync rounds can come out of it."""
    if not spec.secure_aggregation.enabled:
        return
    problem = None
    if not cls.private:
        problem = f"{cls.name} cannot sum its clients' updates securely (delta_avg can)"
    elif not spec.clients.enabled:
        problem = "secure aggregation needs federated clients (set clients.count)"
    elif spec.schedule.mode != "sync":
        problem = f"{spec.schedule.mode!r} mode applies single results; use sync rounds"
    elif spec.aggregation_rule != "mean":
        problem = (f"aggregation.rule {spec.aggregation_rule} needs each update; the "
                   f"coordinator sees only their sum (use mean)")
    elif spec.compression.up != "none":
        problem = f"compression.up {spec.compression.up}: masked updates cannot be compressed"
    elif spec.privacy.adaptive:
        problem = ("adaptive clipping counts the updates under the clip, which the "
                   "coordinator cannot see; use a fixed privacy.clip")
    elif spec.privacy.enabled and not spec.secure_aggregation.noise_clients:
        problem = ("with privacy, set secure_aggregation.noise_clients: the clients each "
                   "round's noise is shared among (e.g. clients.per_round)")
    if problem is not None:
        raise ConfigError(f"secure_aggregation: {problem}")


def _check_budget(algorithm: Algorithm, rounds: int) -> None:
    """ConfigError when a private run cannot be accounted (no dp-accounting, a pairing of
    sampling and accountant it lacks) or its rounds would spend more than target_epsilon;
    a run of node-resident clients is checked for the latter when they are announced
    (coordinator/run.py)."""
    settings = getattr(algorithm, "privacy", None)
    if settings is None or not settings.enabled:
        return
    sampling = algorithm.privacy_sampling()  # type: ignore[attr-defined]
    if sampling is not None:
        accounting.check_plan(settings, sampling, rounds)
    else:  # node-resident clients: their plan is checked once they are known
        kind = algorithm.privacy_sampling_kind  # type: ignore[attr-defined]
        accounting.check_accountable(settings, kind)


def _overrides(cls: type[Algorithm], method: str) -> bool:
    """Whether ``cls`` has its own ``method`` rather than the do-nothing one of the base."""
    return getattr(cls, method) is not getattr(Algorithm, method)


def _stream_problem(spec: RunSpec, cls: type[Algorithm]) -> str | None:
    """Why a run's clients cannot be drawn in its asynchronous mode (FedBuff), or None."""
    mode = spec.schedule.mode
    if not _overrides(cls, "client_units"):
        return (f"{cls.name} trains clients in sync rounds only ({mode!r} mode draws "
                f"clients under delta_avg)")
    if spec.clients.over_select != 1:  # a new client is drawn as each one finishes
        return (f"over_select has no meaning in {mode!r} mode (a new client is drawn as "
                f"each one finishes); leave it at 1 or use sync rounds")
    if spec.clients.on_nodes and not spec.schedule.updates_per_round:
        # a round's default size comes from the clients, unknown before nodes announce them
        return (f"placement nodes in {mode!r} mode needs schedule.updates_per_round "
                f"(versions per round): its clients are known only once their nodes "
                f"announce them")
    return None


def _outputs(outputs_json: str | None) -> dict[str, int]:
    try:
        outputs = json.loads(outputs_json or "{}")
        if not isinstance(outputs, dict):
            raise ValueError("outputs_json must hold a JSON object")
        return check_outputs(outputs)
    except ValueError as exc:  # JSONDecodeError included
        message = f"outputs_json is not valid JSON: {str(exc)[:200]}" \
            if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InvalidRun(message) from None


def describe(setup: RunSetup, policy: int, nodes: list[str]) -> dict[str, Any]:
    """The run as run.json records it."""
    r = setup.request
    return {"run_id": setup.run_id, "algorithm": r.algorithm, "model": r.model,
            "dataset": r.dataset, "rounds": r.rounds, "config": setup.algorithm.config,
            "policy": policy, "nodes": nodes}
