"""What the engine reports of a run: per-node counts, per-round metrics, live progress.

The engine's own records; the coordinator's service handler and a relay's ping turn them
into Thrift structs only when they answer a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def fields_of(record: Any) -> dict[str, Any]:
    """A record's fields by name, one level deep (its lists and dicts copied, records in
    them left as they are): dataclasses.asdict for a caller that converts the records
    inside itself, without asdict's deep copy of everything (a status call's 48 nodes)."""
    out = {}
    for f in fields(record):
        value = getattr(record, f.name)
        out[f.name] = (list(value) if isinstance(value, list)
                       else dict(value) if isinstance(value, dict) else value)
    return out


@dataclass(kw_only=True)
class NodeCounts:
    """One node's counts in a run: its answers by outcome, the samples it computed and
    where its time went. The engine keeps them per node (NodeHandle.stats); a summary and
    the run store's record are these counts with more about the node."""

    accepted: int = 0
    rejected: int = 0
    delayed: int = 0
    failed: int = 0
    cancelled: int = 0
    samples: int = 0  # rows or images of the units it completed (the loser of a race too)
    busy_seconds: float = 0.0  # from call to answer, summed over calls
    compute_seconds: float = 0.0  # in the unit maths, as the node reports
    delay_seconds: float = 0.0  # in simulated load delays, as the node reports

    def count_fields(self) -> dict[str, int | float]:
        """The counts alone, by name (of a summary or a record too): to build another
        record of the same counts."""
        return {f.name: getattr(self, f.name) for f in fields(NodeCounts)}


@dataclass(kw_only=True)
class NodeSummary(NodeCounts):
    """One node's counts in a run, as the summary and `status` show them."""

    node: str
    state: str  # alive, suspect or dead (unknown: a stored node never heard from)
    silent_seconds: float | None  # None: never heard from
    pull: bool
    role: str | None = None  # what computes its units: "relay of 3 nodes", "2 local workers"
    # a relay's group as its pings last said: its members' counts since the relay started
    members: list[NodeSummary] = field(default_factory=list)
    note: str | None = None  # why the node is left out of the run, if it is
    refused: str | None = None  # why its last refused result was refused, if one was


@dataclass
class RoundMetrics:
    round: int
    validation_error: float
    validation_loss: float
    train_loss: float
    seconds: float
    update_seconds: float | None = None  # applying the update and evaluating
    scores: dict[str, float] | None = None  # offline scores when due (IS, FID)


@dataclass
class RunSnapshot:
    """A run's progress at one moment."""

    run_id: str
    state: str
    round: int
    rounds: int
    validation_error: float
    units_done: int
    units_total: int
    rejected: int
    failed: int
    in_flight: int
    elapsed_seconds: float
    nodes: list[NodeSummary] = field(default_factory=list)
    message: str | None = None
    stale: int = 0
    cancelled: int = 0
    epoch: float | None = None
    train_loss: float | None = None
    mode: str | None = None  # schedule.mode; the rest is for the asynchronous modes only
    model_version: int | None = None
    pass_index: int | None = None
    todo: int | None = None
    pending: int | None = None
    done: int | None = None
    clients: dict[str, float] | None = None  # federated clients: the latest round's figures
    discarded: int = 0  # units given up after too many failures (their rounds went on)
    discard_reason: str | None = None  # the latest discard's: "unit <id> on <node>: <why>"
    recent_rounds: list[RoundMetrics] | None = None  # the latest rounds (RECENT_ROUNDS)
    algorithm: str | None = None  # what the run trains with, for `client.py runs`
    model: str | None = None
