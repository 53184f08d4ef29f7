"""Secure rounds: the coordinator learns only the sum of a round's client updates.

A sync round of a run with ``secure_aggregation`` (SecAgg+ of Bell et al. 2020, on the
primitives of training/secure_aggregation/) goes through four steps, each a set of units
the engine runs like any other (retries, drop-outs, pull nodes), through the usual
``train_with_weights`` call:

1. keys: each of the round's clients makes its secrets on a node that holds it and
   answers two public keys; the clients that answer are U1, and each one's later phases
   go to that node only (`UnitSpec.only_node`): its secrets live there.
2. shares: each client of U1 gets U1's public keys, and answers its secrets' Shamir shares,
   sealed to each of its neighbours; those that answer are U2.
3. training: each client of U2 trains as in a plain round (its unit is in the run store's
   ledger) and answers its update weighted by its examples, clipped, quantised and masked;
   U3 are those whose masked update came back.
4. unmask: each client of U3 gets the sealed shares addressed to it and answers, for each
   sender, a share of its self mask (sender in U3) or of its mask key (sender dropped).

The coordinator adds U3's masked updates, rebuilds the masks from the shares and takes
them off: what is left is the weighted sum of U3's updates, divided by U3's weights, the
sample-weighted mean a plain round computes, within the quantisation bound. In a private
run each client clipped and noised its own update (training/privacy/distributed.py) and
every client weighs the same: the sum, with the noise fewer than ``noise_clients`` left
short added here, over the expected clients is DP-FedAvg's noised mean. The coordinator is
the party that noise protects against, and the unmask step's answers let it learn the
noised sum: the round's release is charged to the run's budget, committed in the run
store, before step 4 is asked (coordinator/privacy_budget.py), each time the round is
computed. A round whose sum cannot be rebuilt (too many clients dropped out between steps
3 and 4) leaves the model unchanged, with a warning, as a round whose clients all dropped
out does.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from thrift_trainer.coordinator.run_tasks import RunTasks
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.phase_clock import PhaseClock
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.round_engine import RoundEngine
from thrift_trainer.engine.round_state import RoundOutcome
from thrift_trainer.engine.tasks import Task
from thrift_trainer.training.privacy import distributed, mechanism
from thrift_trainer.training.schema import PrivacySettings, SecureAggregationSettings
from thrift_trainer.training.secure_aggregation import messages, quantize, ring, server
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.graph import neighbours
from thrift_trainer.training.units import UnitFailure, UnitResult, UnitSpec, Weights

log = logging.getLogger("coordinator.run")

# Runs a round's training units, each task with the given payload (training_loop.py).
TrainUnits = Callable[[list[UnitSpec], Mapping[str, bytes]], RoundOutcome]


@dataclass(frozen=True)
class PrivateSums:
    """A private run's: its settings, the expected clients per round (asked when needed:
    node-resident clients are known late), the noise key the coordinator's top-up noise is
    keyed by (asked when needed: a resume restores it from the checkpoint), and how a
    round's release is charged to the budget (committed in the run store before it returns;
    it raises when it cannot be, and the round stops before its unmask step)."""

    settings: PrivacySettings
    noise_clients: int
    expected: Callable[[], float]
    key: Callable[[], bytes]
    charge: Callable[[int], None]


@dataclass(frozen=True)
class Advertised:
    """What the keys step gathered (U1): by client, its public keys, the node its secrets
    live on, and its commitment to its self-mask seed."""

    keys: dict[str, tuple[bytes, bytes]]
    nodes: dict[str, str]
    commitments: dict[str, bytes]


@dataclass(frozen=True)
class SecureOutcome:
    """A secure round: its training units' outcome (with the clients that left in the
    other steps among the dropped) and the mean update, None when there is none."""

    outcome: RoundOutcome
    mean: Weights | None


class SecureRounds:
    """The steps of a run's secure rounds; see the module docstring."""

    def __init__(self, settings: SecureAggregationSettings, tasks: RunTasks,
                 samples: Callable[[UnitSpec], int | None],
                 private: PrivateSums | None = None) -> None:
        self.settings, self.tasks, self.samples = settings, tasks, samples
        self.private = private
        self._engine: RoundEngine | None = None

    def run(self, engine: RoundEngine, round_index: int, units: list[UnitSpec],
            weights: Weights, train: TrainUnits,
            clock: PhaseClock | None = None) -> SecureOutcome:
        """The round's four steps; ``clock`` (the round's, whose ``units`` phase holds
        this call) gets each step's seconds as the phases ``secure_keys``,
        ``secure_shares``, ``secure_train``, ``secure_unmask`` and ``secure_sum``."""
        clock = clock if clock is not None else PhaseClock()
        steps = self._steps(engine)
        context = f"{self.tasks.run_id}/{round_index}/{secrets.token_hex(8)}"
        step = _Step(steps, self.tasks, round_index, context)
        left: list[UnitFailure] = []
        with clock.phase("secure_keys"):
            advertised = step.keys(units, left)
        keys = advertised.keys
        pinned = [replace(u, only_node=advertised.nodes[u.client]) for u in units
                  if u.client in keys]
        with clock.phase("secure_shares"):
            sealed = step.shares(pinned, keys, self.settings.neighbours, left)
        u2 = [u for u in pinned if u.client in sealed]
        shares = self._weights(u2, len(keys))
        scale = quantize.scale_for(self.settings.clip_range, self.settings.bits,
                                   max(1, len(keys)))
        with clock.phase("secure_train"):
            outcome = train(u2, self._masking(context, shares, scale))
            masked = self._checked(outcome, weights, left)
        silent: list[UnitFailure] = []  # their updates count: no drop-out, a log line
        with clock.phase("secure_unmask"):
            if self.private is not None:  # the unmask's answers reveal the noised sum to
                # the coordinator, whom the clients' noise protects against: charged first
                self.private.charge(round_index)
            revealed = step.unmask([u for u in u2 if u.client in masked], sealed, silent)
        if silent:
            log.info("round %d: %d clients did not answer the unmask step (%s)", round_index,
                     len(silent), silent[0].reason)
        outcome = replace(outcome, dropped=outcome.dropped + left)
        with clock.phase("secure_sum"):
            total = self._sum(round_index, context, advertised, sealed, masked, revealed,
                              scale, weights)
        if total is None:
            return SecureOutcome(outcome, None)
        mean = self._private_mean(round_index, total, len(keys), len(masked), weights) \
            if self.private is not None else \
            total / sum(shares[client] for client in masked)
        log.info("round %d: securely summed %d clients' updates", round_index, len(masked))
        return SecureOutcome(outcome, _tensors(mean, weights))

    def _steps(self, engine: RoundEngine) -> RoundEngine:
        """An engine beside the run's for the key, share and unmask units: the same
        nodes and policy; no ledger (they train nothing), no backup attempts (a client's
        step goes to its one node)."""
        if self._engine is None:
            progress = RunProgress(engine.run_id, 1, 0, lambda: [])
            self._engine = RoundEngine(
                engine.run_id, engine.nodes, engine.policy,
                replace(engine.settings, speculation=False, deterministic=False),
                progress, engine.cancelled, UnitLedger(None, engine.run_id), engine.cancels)
        self._engine.set_nodes(engine.nodes)
        return self._engine

    def _weights(self, u2: list[UnitSpec], advertised: int) -> dict[str, float]:
        """Each client's weight in the sum, at most 1 together: its share of U2's examples,
        or, in a private run, where every client counts once, 1 / |U1|."""
        if self.private is not None:
            return {u.client or "": 1.0 / advertised for u in u2}
        sizes = {u.client or "": float(self.samples(u) or 0) for u in u2}
        total = sum(sizes.values())
        return {client: size / total if total else 0.0 for client, size in sizes.items()}

    def _masking(self, context: str, shares: Mapping[str, float],
                 scale: float) -> dict[str, bytes]:
        """Each training unit's instructions: the clients whose masks it adds (U2), its
        weight and the scale of the quantisation."""
        u2 = sorted(shares)
        return {client: messages.encode({"context": context, "u2": u2, "scale": scale,
                                         "weight": weight})
                for client, weight in shares.items()}

    def _checked(self, outcome: RoundOutcome, weights: Weights,
                 left: list[UnitFailure]) -> dict[str, UnitResult]:
        """U3: the masked updates that have the model's tensors in the ring's integers; a
        client whose update does not is treated as dropped out."""
        dtype = messages.wire_dtype(self.settings.bits)
        masked = {}
        for result in outcome.results:
            update = result.update
            if sorted(update) == sorted(weights) and all(
                    update[n].dtype == dtype and update[n].shape == np.shape(weights[n])
                    for n in update):
                masked[result.unit.client or ""] = result
            else:
                left.append(UnitFailure(result.unit, "secure aggregation: its masked update "
                                                     "is not the model's shape in the ring"))
        return masked

    def _sum(self, round_index: int, context: str, advertised: Advertised,
             sealed: Mapping[str, Mapping[str, bytes]], masked: Mapping[str, UnitResult],
             revealed: Mapping[str, Mapping[str, tuple[str, bytes]]], scale: float,
             weights: Weights) -> np.ndarray | None:
        """U3's weighted sum, flat in name order, from their masked updates; None (with a
        warning) when there is none to rebuild."""
        if not masked:
            log.warning("round %d: no client's masked update came in; the model is unchanged",
                        round_index)
            return None
        names = sorted(weights)
        bits = self.settings.bits
        total = None
        for result in masked.values():
            flat = np.concatenate([result.update[name].ravel() for name in names]).view(
                ring.ring_dtype(bits))
            total = flat if total is None else ring.add(total, flat, bits)
        try:
            summed = server.unmask_sum(
                [total], advertised.keys, set(sealed), set(masked), revealed,
                self.settings.neighbours, self.settings.threshold, context.encode(), bits,
                advertised.commitments)
        except SecAggError as exc:
            log.warning("round %d: secure aggregation could not rebuild the sum (%s); the "
                        "model is unchanged", round_index, exc)
            return None
        return quantize.dequantize(summed, scale, bits)

    def _private_mean(self, round_index: int, total: np.ndarray, advertised: int,
                      contributed: int, weights: Weights) -> np.ndarray:
        """DP-FedAvg's noised mean from the sum of noised, clipped updates weighted
        1 / |U1|: the noise fewer than ``noise_clients`` clients left short is added
        (keyed by the run's secret noise key and the round), and the sum divided by the
        expected clients."""
        private = self.private
        assert private is not None
        std = distributed.shortfall_std(private.settings, private.noise_clients, contributed)
        if std > 0:
            log.warning("round %d: %d clients' noise is in the sum, %d were to share it: the "
                        "coordinator adds the rest (it saw the sum with less noise than "
                        "epsilon assumes)", round_index, contributed, private.noise_clients)
            drawn = mechanism.noise(weights, std, private.key(), round_index)
            total = total * advertised + np.concatenate(
                [drawn[name].ravel() for name in sorted(weights)])
        else:
            total = total * advertised
        return total / private.expected()


class _Step:
    """The key, share and unmask units of one secure round."""

    def __init__(self, engine: RoundEngine, tasks: RunTasks, round_index: int,
                 context: str) -> None:
        self.engine, self.tasks = engine, tasks
        self.round_index, self.context = round_index, context

    def keys(self, units: list[UnitSpec], left: list[UnitFailure]) -> Advertised:
        """U1's public keys and seed commitments, and the node each one's secrets live
        on."""
        def parse(answer: dict, result: UnitResult) -> tuple[tuple[bytes, bytes], bytes, str]:
            pair = (messages.from_text(answer.get("c")), messages.from_text(answer.get("s")))
            return pair, messages.from_text(answer.get("b")), result.node or ""

        answers = self._run(messages.KEYS, units, {u.client: {} for u in units}, left, parse)
        return Advertised({client: pair for client, (pair, _, _) in answers.items()},
                          {client: node for client, (_, _, node) in answers.items()},
                          {client: seed for client, (_, seed, _) in answers.items()})

    def shares(self, units: list[UnitSpec], keys: Mapping[str, tuple[bytes, bytes]],
               k: int, left: list[UnitFailure]) -> dict[str, dict[str, bytes]]:
        """U2: each sender's shares, sealed, by the neighbour they are for. A client is
        sent U1's names and only its neighbours' keys: with SecAgg+'s sparse graph, the
        step's bytes grow as clients x neighbours, not clients squared."""
        u1 = sorted(keys)
        graph = neighbours(u1, k)
        text = {client: [messages.to_text(c), messages.to_text(s)]
                for client, (c, s) in keys.items()}
        payloads = {u.client: {"u1": u1, "keys": {v: text[v] for v in
                                                  [u.client, *graph[u.client or ""]]}}
                    for u in units}
        return self._run(messages.SHARES, units, payloads, left,
                         lambda answer, _: messages.byte_map(answer.get("sealed"), "sealed"))

    def unmask(self, units: list[UnitSpec], sealed: Mapping[str, Mapping[str, bytes]],
               left: list[UnitFailure]) -> dict[str, dict[str, tuple[str, bytes]]]:
        """What each client of U3 reveals: by owner, the kind and the share."""
        u3 = sorted(u.client for u in units)
        payloads = {client: {"u3": u3, "sealed": messages.text_map(
            {sender: to[client] for sender, to in sealed.items() if client in to})}
            for client in u3}
        return self._run(messages.UNMASK, units, payloads, left, _revealed)

    def _run(self, kind: str, units: list[UnitSpec], payloads: Mapping[str, dict],
             left: list[UnitFailure], parse: Callable[[dict, UnitResult], Any]
             ) -> dict[str, Any]:
        """The step's units, each with its payload; the answers by client, as ``parse``
        reads them. A client whose unit failed or dropped out, or whose answer ``parse``
        refuses, is left out."""
        step = [replace(u, unit_id=f"{kind}-{u.client}", kind=kind) for u in units]
        encoded = {client: messages.encode({"context": self.context, **payload})
                   for client, payload in payloads.items()}

        def build(unit: UnitSpec, attempt: int) -> Task:
            task = self.tasks.task(self.round_index, unit, attempt, {})
            return replace(task, secure_aggregation=encoded[unit.client or ""])

        outcome = self.engine.run_round(self.round_index, step, len(step), build, filters=[])
        left += [UnitFailure(f.unit, f"secure aggregation ({kind}): {f.reason}")
                 for f in outcome.failures + outcome.dropped]
        answers = {}
        for result in outcome.results:
            try:
                answers[result.unit.client or ""] = parse(
                    messages.decode(result.secure_aggregation), result)
            except SecAggError as exc:
                left.append(UnitFailure(result.unit, f"secure aggregation ({kind}): {exc}"))
        return answers


def _revealed(answer: dict, result: UnitResult) -> dict[str, tuple[str, bytes]]:
    """An unmask answer's shares: by owner, the kind and the share."""
    shares = answer.get("revealed")
    if not isinstance(shares, dict) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in shares.values()):
        raise SecAggError(f"{result.unit.client}'s unmask answer has no revealed shares")
    return {str(owner): (str(pair[0]), messages.from_text(pair[1]))
            for owner, pair in shares.items()}


def _tensors(flat: np.ndarray, like: Weights) -> Weights:
    """``flat`` cut into tensors shaped and typed like ``like``'s, in name order."""
    out, start = {}, 0
    for name in sorted(like):
        value = np.asarray(like[name])
        out[name] = flat[start:start + value.size].reshape(value.shape).astype(value.dtype)
        start += value.size
    return out
