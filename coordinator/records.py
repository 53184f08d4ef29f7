"""What a run reports about itself: per-node counts, per-round metrics, live progress.

The coordinator's own records; the service handler turns them into Thrift structs
(coordinator.status_wire) only when it answers a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NodeSummary:
    """One node's counts in a run, as the summary and `status` show them."""

    node: str
    accepted: int
    rejected: int
    delayed: int
    failed: int
    cancelled: int
    busy_seconds: float
    compute_seconds: float
    delay_seconds: float
    state: str  # alive, suspect or dead (unknown: a stored node never heard from)
    silent_seconds: float | None  # None: never heard from
    pull: bool
    role: str | None = None  # what computes its units: "relay of 3 nodes", "2 local workers"
    # a relay's group as its pings last said: its members' counts since the relay started
    members: list[NodeSummary] = field(default_factory=list)


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


@dataclass(frozen=True)
class RunRequest:
    """What a client asks to train (the TrainRequest of the service, without its envelope)."""

    run_id: str
    algorithm: str
    model: str
    dataset: str
    rounds: int
    config_json: str
    outputs_json: str | None = None


@dataclass
class RunOutcome:
    """A run trained to its end."""

    run_id: str
    validation_error: float
    rounds: int
    wall_seconds: float
    history: list[RoundMetrics]
    nodes: list[NodeSummary]
    weights: dict[str, Any]  # name -> numpy array: the final model
    model_json: str
    run_dir: str
    bytes_up: int = 0  # update payload bytes received from nodes, at the transport
    bytes_down: int = 0  # weight payload bytes sent to nodes
    aggregation: str = "mean"  # the rule that combined updates
    compression_json: str = "{}"  # the compression settings used, as JSON


class InvalidRun(ValueError):
    """A request that cannot be run; the message names the field and why."""


class RunFailed(Exception):
    """A run that could not finish; `nodes_tried` names the nodes it used."""

    def __init__(self, message: str, nodes_tried: list[str]) -> None:
        super().__init__(message)
        self.nodes_tried = nodes_tried


class RunStopped(Exception):
    """A run cancelled before its end (by its client, or by itself)."""
