"""What the run store holds and says, whichever database keeps it: the life cycle's
states and moves (see coordinator/run_store.py's docstring), the store's errors and the
records its queries return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thrift_trainer.engine.ledger import RunStoreError, StoreUnavailable
from thrift_trainer.engine.records import NodeCounts

__all__ = ["RunStoreError", "StoreUnavailable"]  # the base errors, for the store's callers

RUN_STATES = ("running", "completed", "failed", "cancelled")
END_STATES = frozenset(RUN_STATES[1:])
UNIT_STATUSES = ("pending", "in_progress", "completed", "failed", "stale", "cancelled",
                 "discarded")
SETTLED = frozenset({"completed", "discarded", "cancelled"})
UNSETTLED = tuple(s for s in UNIT_STATUSES if s not in SETTLED)
STARTABLE = frozenset({"pending", "in_progress", "failed", "stale"})
ATTEMPT_ENDS = frozenset({"completed", "failed", "stale", "pending", "discarded", "cancelled"})
LATE_ENDS = ATTEMPT_ENDS - {"completed"}  # an attempt ending after its unit settled
COUNTED_FAILURES = frozenset({"failed", "stale", "discarded"})
MOVES: Mapping[str, frozenset[str]] = {  # move_unit: unit-level moves without an attempt
    "pending": frozenset({"cancelled", "discarded"}),
    "failed": frozenset({"pending", "cancelled", "discarded"}),
    "stale": frozenset({"pending", "cancelled", "discarded"}),
    "in_progress": frozenset({"stale", "cancelled"}),  # live attempts may still answer
}
NODE_OUTCOMES = frozenset({"completed", "rejected", "cancelled"})
MAX_UNITS_PER_CALL = 100_000
MAX_LIST = 10_000

UnitKey = tuple[str, int, str]  # (run_id, round, unit_id)


class SchemaError(RunStoreError):
    """The file is not a run store, or holds a schema this code does not know."""


class UnknownRecord(RunStoreError, LookupError):
    """No such run, unit or attempt."""


class IllegalTransition(RunStoreError, ValueError):
    """A status change the life cycle forbids; the message names both states."""


@dataclass(frozen=True)
class RunRecord:
    """One run as `client.py runs` lists it; config is the decoded JSON."""

    run_id: str
    created: float
    state: str
    algorithm: str
    model: str
    dataset: str
    rounds: int
    config: dict[str, Any]
    policy: int | None
    message: str | None
    ended: float | None
    rounds_done: int


@dataclass(frozen=True)
class RoundRecord:
    """A finished round's metrics (NaN reads back as None)."""

    round: int
    validation_error: float | None
    validation_loss: float | None
    train_loss: float | None
    seconds: float | None
    completed_units: int
    discarded_units: int
    ended: float


@dataclass(frozen=True)
class PrivacyCharge:
    """One release of a private run's noised update, charged to its budget before anyone
    could see it (coordinator/ledger_charges.py): the run's ``charge``-th, in ``round``,
    with the run's epsilon after it (None: no finite epsilon)."""

    charge: int
    round: int
    epsilon: float | None
    time: float


@dataclass(frozen=True)
class UnitEvent:
    """One status change of a unit: replaying them gives its history."""

    round: int
    unit_id: str
    attempt: int | None
    node: str | None
    from_status: str | None  # None for the event that planned the unit
    to_status: str
    attempt_status: str | None  # the attempt's own status; None for unit-level moves
    reason: str | None
    time: float


@dataclass(frozen=True)
class UnfinishedUnit:
    """What `client.py status` shows so that a stall explains itself."""

    round: int
    unit_id: str
    status: str
    node: str | None  # owner: the newest live attempt's node, else the last node that held it
    age_seconds: float  # since the owner started it, else since the last status change
    attempts: int
    live_attempts: int
    failures: int
    last_reason: str | None


@dataclass(kw_only=True)
class NodeRecord(NodeCounts):
    """A node's counts within one run, as in the client's summary table. The store keeps
    answers and samples, not seconds: those read 0."""

    node: str
    last_answer: float | None
    last_failure: float | None
    last_reason: str | None
    last_heartbeat: float | None = None
