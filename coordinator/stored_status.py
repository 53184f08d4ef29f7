"""A run's status from the run store alone: what `status` and `runs` show of a run this
process did not run (one from before a restart, or a leader's before a takeover), with
everything the store kept: a private run's epsilon, as its live status shows it, is its
latest charge's (coordinator/ledger_charges.py)."""

from __future__ import annotations

import math
import time

from thrift_trainer.coordinator.privacy_budget import EPSILON
from thrift_trainer.coordinator.store_protocol import LedgerQueries
from thrift_trainer.coordinator.store_records import (
    NodeRecord,
    PrivacyCharge,
    RoundRecord,
    RunRecord,
)
from thrift_trainer.engine.records import NodeSummary, RunSnapshot

NO_ERROR = -1.0  # RunStatus.validation_error before any round was measured


def stored_status(store: LedgerQueries, record: RunRecord, suspect_seconds: float,
                  dead_seconds: float) -> RunSnapshot:
    """The run's latest metrics, units and per-node counts as the store recorded them;
    a node's state is the one it had when the run ended, judged from when it was last
    heard from with the coordinator's suspect and dead thresholds."""
    rounds = store.list_rounds(record.run_id)
    nodes = store.node_stats(record.run_id)
    ended = record.ended if record.ended is not None else time.time()
    done = sum(r.completed_units for r in rounds)
    per_round = rounds[-1].completed_units if rounds else 0
    return RunSnapshot(
        run_id=record.run_id, state=record.state, round=record.rounds_done,
        rounds=record.rounds, validation_error=_latest_error(rounds), units_done=done,
        units_total=done + max(0, record.rounds - len(rounds)) * per_round,
        rejected=sum(n.rejected for n in nodes), failed=sum(n.failed for n in nodes),
        in_flight=0, elapsed_seconds=ended - record.created,
        nodes=[_node_summary(n, ended, suspect_seconds, dead_seconds) for n in nodes],
        message=record.message, cancelled=sum(n.cancelled for n in nodes),
        train_loss=_finite(rounds[-1].train_loss) if rounds else None,
        discarded=store.ledger_counts(record.run_id).get("discarded", 0),
        discard_reason=store.latest_discard(record.run_id),
        algorithm=record.algorithm, model=record.model,
        clients=_privacy(store.privacy_charges(record.run_id)))


def _privacy(charges: list[PrivacyCharge]) -> dict[str, float] | None:
    """The run's epsilon after every release charged, under the live status's key
    (infinite without noise, as there); None for a run never charged (no privacy)."""
    epsilon = charges[-1].epsilon if charges else None
    return None if epsilon is None else {EPSILON: epsilon}


def _latest_error(rounds: list[RoundRecord]) -> float:
    """The latest measured validation error (a round may skip it: NaN, stored as NULL)."""
    for r in reversed(rounds):
        if _finite(r.validation_error) is not None:
            return r.validation_error
    return NO_ERROR


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _node_summary(n: NodeRecord, ended: float, suspect_seconds: float,
                  dead_seconds: float) -> NodeSummary:
    heard = [t for t in (n.last_heartbeat, n.last_answer) if t is not None]
    silent = max(0.0, ended - max(heard)) if heard else None
    if silent is None:
        state = "unknown"  # never heard from during the run
    else:
        state = ("alive" if silent < suspect_seconds else
                 "suspect" if silent < dead_seconds else "dead")
    return NodeSummary(**n.count_fields(), node=n.node, state=state, silent_seconds=silent,
                       pull=False)
