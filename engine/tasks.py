"""What the engine sends a node and what comes back, in the coordinator's own types.

Node clients (engine.nodes.client) translate these to and from their transport
(engine.nodes.thrift_client for Thrift). Tensors are numpy arrays by name here: a node client
encodes `Task.weights` for its transport (without copying; one dict is shared by every unit
of a round) and decodes `TaskResult.update`, refusing a malformed one as InvalidResult.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from thrift_trainer.training.units import TensorSpecs

Tensors = dict[str, np.ndarray]  # tensor name -> array


class TaskStatus(enum.Enum):
    COMPLETED = "completed"  # the update is in the result
    REJECTED = "rejected"  # the node refused the unit (its load): try another node
    CANCELLED = "cancelled"  # cancelled while it waited or ran


@dataclass(frozen=True)
class Task:
    """One attempt of one unit, computed from the weights of model version `round`."""

    run_id: str
    round: int  # the model version the weights belong to
    unit_id: str
    attempt: int
    algorithm: str
    model: str
    dataset: str
    unit_path: str
    config_json: str
    weights: Tensors  # the model's (or the unit's own) tensors, possibly compressed
    scheduling_policy: int
    index_start: int | None = None
    index_stop: int | None = None
    # The global-model version the weights are: sync rounds use round - 1; asynchronous
    # modes count one version per applied update (a result's staleness is measured by it).
    model_version: int | None = None
    # (part, parts): only that share of the unit (a relay's local rounds); None: all of it
    share: tuple[int, int] | None = None
    # the tensors a result's update must have, for a relay to check its members' results
    expected_update: TensorSpecs | None = None
    client: str | None = None  # the federated client whose examples the unit trains on
    kind: str = "train"  # "evaluate": score the weights on the client's validation part
    # a secure-aggregation round's data for the client (JSON, coordinator/secure_rounds.py)
    secure_aggregation: bytes | None = None

    @property
    def version(self) -> int:
        return self.round - 1 if self.model_version is None else self.model_version

    @property
    def key(self) -> tuple[str, str, int]:
        return self.run_id, self.unit_id, self.attempt


@dataclass
class TaskResult:
    """A node's answer to a task (any status)."""

    status: TaskStatus
    update: Tensors  # empty unless COMPLETED; possibly compressed
    num_samples: int
    model_version: int  # the `version` of the task it answers
    loss: float = 0.0
    error: float = 0.0
    compute_seconds: float = 0.0
    delay_seconds: float = 0.0  # time in the node's (simulated) load delay
    message: str | None = None  # why it was rejected or cancelled
    node_id: str | None = None
    loss_before: float | None = None  # a client's loss before local training, if measured
    secure_aggregation: bytes | None = None  # a secure-aggregation phase's answer (JSON)
