"""The training loop: what a run does with each outcome the round engine hands back.

The engine runs units and hands control back: a sync round returns its outcome
(`RoundEngine.run_round`), and an asynchronous run's stream yields each version due and
each round's end (`RoundEngine.stream`). This loop alone turns them into the run's
model, in every mode: it aggregates (the algorithm's `aggregate`), applies, evaluates and
writes each round out, the checkpoint last (`_write_round`). As Flower's `Server` owns
`fit_round`, the engine owns neither the weights nor the optimizer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from thrift_trainer.coordinator import drills
from thrift_trainer.coordinator.checkpoint import Checkpoint, CheckpointError
from thrift_trainer.coordinator.client_eval import Evaluated, evaluate_clients, evaluation_engine
from thrift_trainer.coordinator.client_files import client_rows, fairness, stream_client_rows
from thrift_trainer.coordinator.kept_results import KeptResults
from thrift_trainer.coordinator.privacy_budget import PrivacyBudget
from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.coordinator.run_folder import RunFolder
from thrift_trainer.coordinator.run_tasks import RunTasks, VersionCache
from thrift_trainer.coordinator.secure_rounds import PrivateSums, SecureOutcome, SecureRounds
from thrift_trainer.engine import runtime
from thrift_trainer.engine.client_draws import ClientDraws
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.nodes.run_nodes import RunNodes
from thrift_trainer.engine.pass_queue import PassQueue
from thrift_trainer.engine.phase_clock import PhaseClock
from thrift_trainer.engine.policies import Policy
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.records import RoundMetrics
from thrift_trainer.engine.residual_placement import ResidualPlacement
from thrift_trainer.engine.round_engine import RoundEngine
from thrift_trainer.engine.round_state import RoundOutcome
from thrift_trainer.engine.session_moves import NodeSessions
from thrift_trainer.engine.stream_records import RoundEnd, StreamPosition, VersionDue
from thrift_trainer.engine.stream_state import StreamState
from thrift_trainer.engine.tasks import Task, Tensors
from thrift_trainer.engine.update_filters import NormLimit, UpdateFilter, round_filters
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.compression import CompressionSettings, encode_weights
from thrift_trainer.training.outputs.plots import due
from thrift_trainer.training.schedule import ScheduleSettings, staleness_warning
from thrift_trainer.training.secure_aggregation import settings as secure_aggregation
from thrift_trainer.training.units import RoundEval, UnitFailure, UnitResult, UnitSpec, Weights

log = logging.getLogger("coordinator.run")


@dataclass(frozen=True)
class LoopParts:
    """What the loop works with, owned by the run (coordinator/run.py)."""

    run_id: str
    request: RunRequest
    algorithm: Algorithm
    schedule: ScheduleSettings
    compression: CompressionSettings
    outputs: dict[str, Any]
    folder: RunFolder
    progress: RunProgress
    ledger: UnitLedger
    nodes: RunNodes
    kept: KeptResults
    policy: Policy  # its random state goes into each checkpoint
    tasks: RunTasks
    max_update_norm: float | None
    # called before each sync round (a run with clients asks nodes back from silence which
    # clients they hold: coordinator/run.py)
    before_round: Callable[[], None] | None = None


class TrainingLoop:
    """Trains a run's rounds after its starting point; see the module docstring."""

    def __init__(self, parts: LoopParts, planned: int, updates_per_round: int,
                 resume_from: Checkpoint | None, resumed: bool) -> None:
        self.parts = parts
        self.algorithm, self.schedule = parts.algorithm, parts.schedule
        self.compression, self.rounds = parts.compression, parts.request.rounds
        self._planned = planned  # units a sync round plans
        self._updates_per_round = updates_per_round  # versions an asynchronous round makes
        self._resume_from = resume_from
        self._resumed = resumed
        self._norm_limit = NormLimit(parts.max_update_norm)  # keeps its history
        # topk residuals live on the node that computed a slot: its units go back there
        self._residuals = ResidualPlacement(
            lambda unit: self.algorithm.unit_slot(unit, self.algorithm.config)) \
            if self.compression.keeps_residuals else None
        # sync rounds of an algorithm that draws them from passes over the data
        self._passes = PassQueue(self.algorithm.plan_pass, position_of(resume_from)) \
            if self.algorithm.rounds_from_passes and not self.schedule.asynchronous else None
        if self._passes is not None:
            passes, progress = self._passes, parts.progress
            progress.stream_counts = lambda: {**passes.counts(), "version": progress.round}
        # federated evaluation (coordinator/client_eval.py): its engine, made when first
        # needed, and the weights it sent with their encoding, which the next round reuses
        self._eval_engine: RoundEngine | None = None
        self._sent: tuple[Weights, Tensors] | None = None
        self._latest_eval: dict[str, float] = {}  # the status shows it until the next
        secure = secure_aggregation.settings_from(
            self.algorithm.config.get(secure_aggregation.SECTION))
        # None: the run is not private. Its releases are charged in the run store before
        # anyone can see them: each computation of a secure round, or each round once.
        self._budget = PrivacyBudget.of(self.algorithm, parts.ledger.store, parts.run_id,
                                        each_computation=secure.enabled)
        self._secure = SecureRounds(secure, parts.tasks, self.algorithm.unit_samples,
                                    self._private_sums(secure.noise_clients)) \
            if secure.enabled else None  # coordinator/secure_rounds.py

    def run(self, engine: RoundEngine, weights: Weights, done: int,
            history: list[RoundMetrics]) -> Weights:
        """The rounds after ``done``, from ``weights``; each round's metrics go into
        ``history``. Returns the last round's weights."""
        # what results must hold, sent with each unit so that relays check their members'
        self.parts.tasks.expected_update = self.algorithm.expected_update(weights)
        if not self.schedule.asynchronous:
            for round_index in range(done + 1, self.rounds + 1):
                weights, metrics = self._round(engine, round_index, weights)
                history.append(metrics)
            return weights
        if done < self.rounds:  # (resumed after its last checkpoint, a run has only its
            # end to write)
            weights = self._stream(engine, done, weights, history)
        return weights

    # ------------------------------------------------------------ sync rounds
    def _round(self, engine: RoundEngine, round_index: int,
               weights: Weights) -> tuple[Weights, RoundMetrics]:
        self._refresh_nodes(engine)  # nodes joined or left since the last round
        if self._budget is not None:
            self._budget.check_round(round_index, [n.name for n in engine.nodes])
        if self.parts.before_round is not None:
            self.parts.before_round()
        started, bytes_before = runtime.monotonic(), self._payload_totals()
        clock = PhaseClock()
        with clock.phase("plan"):
            units = self._plan(round_index)
            sent_weights = self._encoded(weights)  # once, for every unit
        with clock.phase("units"):
            secure = self._secure_round(engine, round_index, units, weights, sent_weights,
                                        clock)
            outcome = secure.outcome if secure is not None else \
                self._run_units(engine, round_index, units, weights, sent_weights)
        update_started = runtime.monotonic()
        drills.point("aggregate", round_index)
        with clock.phase("aggregate"):
            if self._passes is not None:  # what the round did not use comes round again
                self._passes.settle([r.unit.unit_id for r in outcome.results]
                                    + outcome.discarded)
            if secure is not None:  # the mean of what the masks hid, when there is one
                weights = weights if secure.mean is None else \
                    self.algorithm.apply(weights, secure.mean)
            elif outcome.results or self._budget is not None:  # a private round's noise
                # is released even when no client took part (an empty Poisson draw)
                weights = self._aggregate(round_index, weights, outcome.results,
                                          outcome.failures)
            else:  # every client of the round dropped out: nothing to apply
                log.warning("round %d: every client asked dropped out (no live node holds "
                            "them); the model is unchanged", round_index)
        clients = client_rows(round_index, outcome.results, outcome.failures, outcome.dropped)
        with clock.phase("after_round"):
            if self._residuals is not None:
                self._residuals.note(units, outcome.placement)
            self.algorithm.after_round(round_index, NodeSessions(
                self.parts.run_id, self.parts.nodes.nodes, outcome.placement,
                cannot_dial=lambda node: not node.accepts_connections))
        figures = fairness(clients)
        if self._budget is not None:
            figures.update(self._released(round_index, secure is not None))
        evaluated = self._evaluate_clients(engine, round_index, weights, clock)
        if evaluated is not None:
            clients, figures = clients + evaluated.rows, {**figures, **evaluated.figures}
            self._latest_eval = evaluated.figures
        self.parts.folder.append_clients(clients)
        position = self._passes.position() if self._passes is not None else None
        metrics = self._write_round(
            RoundEnd(round_index, round_index, weights, outcome.completed, outcome.train_loss,
                     outcome.discarded, position), started, bytes_before, update_started,
            clock, figures)
        return weights, metrics

    def _released(self, round_index: int, charged: bool) -> dict[str, float]:
        """A private round's figures, its release charged first unless it was
        (``charged``: a secure round's, before its unmask step): nothing of the round
        is written or shown before its charge is in the store."""
        budget = self._budget
        assert budget is not None
        if not charged:
            budget.charge(round_index)
        return budget.figures(round_index)

    def _encoded(self, weights: Weights) -> Tensors:
        """The weights as sent: the very tensors a federated evaluation sent of them, so
        that a node that kept them is not sent them again (engine/nodes/sent_weights.py)."""
        if self._sent is not None and self._sent[0] is weights:
            return self._sent[1]
        return encode_weights(weights, self.compression)

    def _evaluate_clients(self, engine: RoundEngine, round_index: int, weights: Weights,
                          clock: PhaseClock, version: int | None = None) -> Evaluated | None:
        """A federated evaluation of the round's new weights (model ``version``: by default
        the round's) when it is due (the algorithm's `evaluation_units`); None when it is
        not."""
        units = self.algorithm.evaluation_units(round_index, self.rounds)
        if not units:
            return None
        with clock.phase("client_eval"):
            if self._eval_engine is None:
                self._eval_engine = evaluation_engine(engine)
            self._eval_engine.set_nodes(engine.nodes)
            self._sent = (weights, encode_weights(weights, self.compression))
            return evaluate_clients(self._eval_engine, self.parts.tasks, round_index, units,
                                    self._sent[1], self.algorithm.scores_accuracy, version)

    def _plan(self, round_index: int) -> list[UnitSpec]:
        """The round's units: from the passes over the data, or the algorithm's plan."""
        units = self._passes.take(self._planned) if self._passes is not None \
            else self.algorithm.plan_round(round_index)
        return self._residuals.prefer(units) if self._residuals is not None else units

    def _private_sums(self, noise_clients: int) -> PrivateSums | None:
        """What a private run's secure rounds need to finish the noised mean."""
        if self._budget is None:
            return None
        return PrivateSums(self._budget.settings, noise_clients,
                           lambda: self._budget.sampling.expected,
                           lambda: self.algorithm.noise_key,  # type: ignore[attr-defined]
                           self._budget.charge)

    def _secure_round(self, engine: RoundEngine, round_index: int, units: list[UnitSpec],
                      weights: Weights, sent_weights: Tensors,
                      clock: PhaseClock) -> SecureOutcome | None:
        """A secure round's steps (coordinator/secure_rounds.py), each timed in
        ``clock``; None in a plain run."""
        if self._secure is None:
            return None
        return self._secure.run(
            engine, round_index, units, weights,
            lambda masked, payloads: self._run_units(engine, round_index, masked, weights,
                                                     sent_weights, payloads), clock)

    def _run_units(self, engine: RoundEngine, round_index: int, units: list[UnitSpec],
                   weights: Weights, sent_weights: Tensors,
                   masking: dict[str, bytes] | None = None) -> RoundOutcome:
        """Enter the round's units in the run store and have the engine run them.
        ``masking``: a secure round's instructions by client; its results are masked, so
        no update filter can read them, and none is kept to be taken up after a resume
        (a resumed round starts its steps again, with fresh secrets)."""
        ledger, kept = self.parts.ledger, self.parts.kept

        def build(unit: UnitSpec, attempt: int) -> Task:
            own = self.algorithm.unit_tensors(unit)  # e.g. MD-GAN's generated batches
            payload = sent_weights if own is None else own
            task = self.parts.tasks.task(round_index, unit, attempt, payload)
            if masking is not None:
                task = replace(task, secure_aggregation=masking[unit.client or ""])
            return task

        earlier = ledger.plan_units(round_index, [unit.unit_id for unit in units])
        ledger.check()
        if masking is not None:
            return engine.run_round(round_index, units, self.algorithm.quorum(len(units)),
                                    build, filters=[],
                                    earlier_attempts=earlier)
        return engine.run_round(
            round_index, units, self.algorithm.quorum(len(units)), build,
            self._filters(weights), earlier_attempts=earlier,
            taken_up=kept.taken_up(round_index, units),
            keep_result=kept.keep if kept.enabled else None)

    # ------------------------------------------------------ asynchronous modes
    def _stream(self, engine: RoundEngine, done: int, weights: Weights,
                history: list[RoundMetrics]) -> Weights:
        """The rounds after ``done`` in an asynchronous mode (engine/stream_state.py):
        units flow without barriers, each version is made here as the stream asks for
        it, and each round is written out as its last version is made."""
        parts = self.parts
        self.algorithm.keep_each_version()
        position = position_of(self._resume_from)
        if self._resumed:  # the units the resume reopened, into the round it starts with
            parts.ledger.gather_units(done, done + 1, "reopened: gathered into the round "
                                      "the resumed run starts with")
        state = StreamState(
            weights=weights, first_round=done + 1, last_round=self.rounds,
            updates_per_round=self._updates_per_round, schedule=self.schedule,
            plan_pass=self.algorithm.plan_pass, scalable=self.algorithm.staleness_scaled,
            ledger=parts.ledger, max_attempts=2 * max(1, len(parts.nodes.nodes)),
            position=position,
            taken_up=parts.kept.taken_up_stream(done + 1), draws=self._draws(engine),
            private=self._budget is not None)  # a release leaves after its checkpoint
        state.keep_result = parts.kept.keep if parts.kept.enabled else None
        parts.progress.stream_counts = state.counts
        self._warn_of_staleness()
        encoded = VersionCache(lambda w: encode_weights(w, self.compression))

        def build(unit: UnitSpec, attempt: int) -> Task:
            round_index, version, current = state.newest()
            return parts.tasks.task(round_index, unit, attempt, encoded.get(version, current),
                                    model_version=version)

        started, bytes_before = runtime.monotonic(), self._payload_totals()
        self._before_round()
        with closing(engine.stream(state, build, self._filters(weights))) as events:
            for event in events:
                if isinstance(event, VersionDue):
                    if self._budget is not None:  # one release a round (updates_per_round 1)
                        self._budget.check_round(event.round, [n.name for n in engine.nodes])
                    weights = self._aggregate(event.round, weights, event.results)
                    state.applied(weights)
                    continue
                history.append(self._write_stream_round(engine, event, started,
                                                        bytes_before))
                started, bytes_before = runtime.monotonic(), self._payload_totals()
                self._refresh_nodes(engine)  # nodes joined or left during the round
                self._before_round()
        return weights

    def _draws(self, engine: RoundEngine) -> ClientDraws | None:
        """A run with federated clients draws them as its units (FedBuff), among the
        clients a node of the run holds (the engine's nodes, read at each draw)."""
        algorithm = self.algorithm
        if algorithm.client_units() is None:
            return None
        return ClientDraws(
            algorithm.config["seed"], lambda: algorithm.client_units() or [],
            lambda client: any(node.holds(client) for node in engine.nodes),
            algorithm.clients_at_once)

    def _write_stream_round(self, engine: RoundEngine, end: RoundEnd, started: float,
                            bytes_before: tuple[int, int]) -> RoundMetrics:
        """An asynchronous round written out, with its clients' lines and figures, and a
        federated evaluation of its last version when one is due."""
        clock = PhaseClock()
        evaluated = self._evaluate_clients(engine, end.round, end.weights, clock, end.version)
        if not end.clients and evaluated is None and self._budget is None:
            return self._write_round(end, started, bytes_before)
        clients = stream_client_rows(end.round, end.clients) if end.clients else []
        figures = fairness(clients) if clients else {}
        if self._budget is not None:  # a private run's round is one release
            figures.update(self._released(end.round, False))
        if evaluated is not None:
            clients, figures = clients + evaluated.rows, {**figures, **evaluated.figures}
            self._latest_eval = evaluated.figures
        self.parts.folder.append_clients(clients)
        return self._write_round(end, started, bytes_before, clock=clock,
                                 client_figures=figures)

    def _before_round(self) -> None:
        if self.parts.before_round is not None:
            self.parts.before_round()

    def _warn_of_staleness(self) -> None:
        """A bound below the usual staleness has most results computed again: say so once."""
        warning = staleness_warning(self.schedule, len(self.parts.nodes.nodes))
        if warning:
            log.warning("run %s: %s", self.parts.run_id, warning)

    # ------------------------------------------------------------ every mode
    def _aggregate(self, round_index: int, weights: Weights, results: list[UnitResult],
                   failures: list[UnitFailure] | None = None) -> Weights:
        """The next weights: a sync round's outcome, or an asynchronous version's buffer
        (which has no failures: a stream retries or discards its units itself)."""
        return self.algorithm.aggregate(round_index, weights, results, failures or [])

    def _filters(self, weights: Weights) -> list[UpdateFilter]:
        return round_filters(self.algorithm, weights, self._norm_limit, self.compression.up)

    def _refresh_nodes(self, engine: RoundEngine) -> None:
        if self.parts.nodes.refresh():
            engine.set_nodes(self.parts.nodes.nodes)

    def _payload_totals(self) -> tuple[int, int]:
        return self.parts.nodes.payload.totals()

    def _write_round(self, end: RoundEnd, started: float, bytes_before: tuple[int, int],
                     update_started: float | None = None,
                     clock: PhaseClock | None = None,
                     client_figures: dict[str, float] | None = None) -> RoundMetrics:
        """Evaluate a round's weights and write the round out: ledger, sample grid,
        metrics and the checkpoint; then the status shows it. ``update_started``: when the
        round's update began (None in the asynchronous modes, whose updates are spread over
        the round);
        ``clock``: the round's phases so far (None where a round has no phases: the
        asynchronous modes); ``client_figures``: the fairness figures of the round's
        federated clients (coordinator/client_files.py), kept with its scores."""
        parts = self.parts
        round_index, weights = end.round, end.weights
        clock = clock or PhaseClock()
        with clock.phase("evaluate"):
            evaluation = self._evaluate(round_index, weights)
        now = runtime.monotonic()
        metrics = RoundMetrics(
            round=round_index, validation_error=evaluation.validation_error,
            validation_loss=evaluation.validation_loss, train_loss=end.train_loss,
            seconds=now - started,
            update_seconds=now - update_started if update_started is not None else 0.0)
        # asynchronous modes count passes instead (the status shows them)
        epochs = None if self.schedule.asynchronous else self.algorithm.epochs_done(round_index)
        log.info("round %d/%d: validation error %.4f (%d units, %d discarded, %.2fs)",
                 round_index, self.rounds, evaluation.validation_error,
                 end.results, len(end.discarded), metrics.seconds)
        with clock.phase("score"):
            self._score(round_index, weights, metrics)
            if client_figures:
                metrics.scores = {**(metrics.scores or {}), **client_figures}
        with clock.phase("ledger"):
            parts.ledger.round_ended(metrics, end.results, len(end.discarded))
            parts.ledger.check()  # a round the store missed must not be checkpointed
        with clock.phase("samples"):
            parts.folder.write_samples(round_index, weights)
        (down, up), (down_before, up_before) = self._payload_totals(), bytes_before
        parts.folder.append_round(metrics, end.discarded,
                                  {"bytes_down": down - down_before, "bytes_up": up - up_before},
                                  clock.rounded())
        # The checkpoint comes last: it is the commit point a resume starts from, so the
        # metrics and the ledger already hold every round it covers.
        parts.folder.write_checkpoint(Checkpoint(
            round_index, weights, self.algorithm.state_dict(), parts.policy.random_state(),
            None if end.position is None else end.position.to_dict()))
        # The status shows the round once it is written: a round it shows is one no crash
        # takes back (a private run's status shows only releases the store has charged).
        parts.progress.round_done(round_index, evaluation.validation_error, end.train_loss,
                                  epochs, metrics)
        if client_figures:
            parts.progress.clients_done({**self._latest_eval, **client_figures})
        return metrics

    def _evaluate(self, round_index: int, weights: Weights) -> RoundEval:
        """The validation metrics every `eval_every` rounds (and after the last); NaN between."""
        if due(self.parts.outputs["eval_every"], round_index, self.rounds):
            return self.algorithm.evaluate(weights)
        return RoundEval(validation_error=math.nan, validation_loss=math.nan)

    def _score(self, round_index: int, weights: Weights, metrics: RoundMetrics) -> None:
        """Offline scores (IS, FID) into the round's metrics, when they are due."""
        if due(self.parts.outputs["eval_every"], round_index, self.rounds):
            metrics.scores = self.algorithm.score(weights, self.parts.outputs["eval_n"]) or None
            if metrics.scores:
                log.info("round %d scores: %s", round_index, ", ".join(
                    f"{k} {v:.4g}" for k, v in metrics.scores.items()))


def position_of(checkpoint: Checkpoint | None) -> StreamPosition | None:
    """Where the checkpoint left the passes over the data, if it says."""
    if checkpoint is None or checkpoint.stream is None:
        return None
    try:
        return StreamPosition.from_dict(checkpoint.stream)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint's stream position is damaged: {exc}") from None
