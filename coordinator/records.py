"""A run as the coordinator's service sees it: the request, the outcome, the errors.

The service handler turns them into Thrift structs (coordinator.status_wire) only when it
answers a call; per-node counts and round metrics are the engine's (engine/records.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thrift_trainer.engine.records import NodeSummary, RoundMetrics


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
