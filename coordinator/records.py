"""What a run reports about itself: per-node counts, per-round metrics, live progress.

The coordinator's own records; the service handler turns them into Thrift structs
(coordinator.status_wire) only when it answers a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    state: str  # alive, suspect or dead
    silent_seconds: float
    pull: bool


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
