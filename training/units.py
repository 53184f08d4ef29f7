"""Work units and what comes of them: the types the round engine, the nodes and the
algorithms share (training/algorithms/base.py says what an algorithm does with them).

A round is planned as `UnitSpec`s; a node computes a `UnitJob` into a `UnitOutput`; the
engine hands an algorithm the `UnitResult`s it accepted and the `UnitFailure`s it gave
up on; `evaluate` scores the global model as a `RoundEval`. Algorithms that keep state on
nodes move it between them through `SessionMoves` (engine/session_moves.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from thrift_trainer.training.cancel import UnitControl

if TYPE_CHECKING:
    from thrift_trainer.training.spec import RunSpec

Weights = dict[str, np.ndarray]
TensorSpecs = Mapping[str, tuple[tuple[int, ...], np.dtype]]  # name -> (shape, dtype)


@dataclass(frozen=True)
class UnitSpec:
    """One work unit of a round: a file of the data set, an index range inside one, or a
    federated client's examples."""

    unit_id: str
    unit_path: str
    index_start: int | None = None
    index_stop: int | None = None
    # Name ("host:port") of the node to try first, e.g. the one holding the unit's session;
    # the engine falls back to any node when that one is gone or benched.
    preferred_node: str | None = None
    # The federated client whose examples the unit trains on (training/clients/): it goes
    # only to a node that holds that client; None: the unit is the data set's to share.
    client: str | None = None
    # TRAIN, or EVALUATE: score the weights on the client's validation part (federated
    # evaluation); such a unit changes nothing and is never averaged into the model
    kind: str = "train"
    # The one node that may compute it (a secure-aggregation client's, whose secrets for
    # the round live there); None: any node that holds its client.
    only_node: str | None = None

    @property
    def evaluates(self) -> bool:
        return self.kind == EVALUATE

    @property
    def seed_id(self) -> str:
        """The id its random draws are seeded by (`unit_seed`): a client's unit that
        relays passed down whole, each adding ``~r<k>``, draws what it draws on a node
        that holds the client directly."""
        if self.client is None:
            return self.unit_id
        return self.unit_id.partition(RELAY_MARK)[0]


TRAIN, EVALUATE = "train", "evaluate"
RELAY_MARK = "~r"  # what a relay adds to the ids of the slices and shares it sends on
UNIT_KINDS = (TRAIN, EVALUATE)


@dataclass
class UnitJob:
    """What a node is asked to compute, decoded from the wire."""

    run_id: str
    round: int
    unit: UnitSpec
    model: str
    config: dict[str, Any]
    weights: Weights
    device: str = "cpu"  # where the node computes: "cpu", "cuda", "cuda:1", ...
    # The node's session store (compute_node/sessions.py) for algorithms that keep state
    # on a node between units (Algorithm.uses_sessions); None where there is none.
    sessions: Any = None
    # The unit's cancel flag and batch count: training loops call ``control.step()``
    # before every batch, so a cancelled unit stops at the next batch (training/cancel.py).
    control: UnitControl = field(default_factory=UnitControl)
    # The request as a relay node forwards it to its group (compute_node/relay.py).
    algorithm: str = ""
    dataset: str = ""
    config_json: str = ""
    model_version: int | None = None
    # (part, parts): compute only that share of the unit (a relay's local rounds send one
    # share to each member); None: the whole unit.
    share: tuple[int, int] | None = None
    # The tensors a result's update must have, as the coordinator checks it (a relay checks
    # its members' results against them); None when the coordinator did not say.
    expected_update: TensorSpecs | None = None
    # ``config`` as the node checked it once for the run (`Algorithm.unit_config`), shared
    # by the run's units and never changed; None: the algorithm checks ``config`` itself.
    checked_config: Mapping[str, Any] | None = None
    # The run's spec as the node parsed it once (a relay reads its sections); None: parse
    # ``config_json`` where it is needed.
    spec: RunSpec | None = None


@dataclass
class UnitOutput:
    """What a node returns for a unit: an update and how much data produced it."""

    update: Weights
    num_samples: int
    loss: float
    error: float
    # a federated client's unit: the loss of the weights it was sent on its training
    # examples, before local training; None where it was not measured
    loss_before: float | None = None


@dataclass
class RoundEval:
    """Metrics of the global model after a round."""

    validation_error: float
    validation_loss: float


@dataclass(frozen=True)
class UnitResult:
    """One result of a round that the engine accepted: its unit, the node's update (checked
    by the round's update filters), how many samples produced it, and its training loss."""

    unit: UnitSpec
    update: Weights
    num_samples: int
    loss: float = float("nan")
    node: str | None = None  # name of the node that computed it
    loss_before: float | None = None  # UnitOutput.loss_before, where the node measured it
    error: float = float("nan")  # the node's metric (an evaluation unit's validation metric)
    secure_aggregation: bytes | None = None  # a secure-aggregation phase's answer (JSON)


@dataclass(frozen=True)
class UnitFailure:
    """A unit of a round that ended without a result (discarded after its failures)."""

    unit: UnitSpec
    reason: str


class SessionMoveError(Exception):
    """A node session could not be moved; the message names both ends and the cause."""


@dataclass(frozen=True)
class SessionMoved:
    """What one move carried: payload bytes, and whether it went through the coordinator."""

    bytes: int
    relayed: bool


class SessionMoves(Protocol):
    """What `Algorithm.after_round` may do with node sessions. The coordinator implements
    it over its node connections (engine/session_moves.py); tests may use stores."""

    # unit id -> name ("host:port") of the node whose result the round used
    placement: Mapping[str, str]

    def move(self, source: str, session: str, target: str, target_session: str,
             swap_id: int) -> SessionMoved:
        """Copy ``session`` of node ``source`` into ``target_session`` of node ``target``,
        staged under ``swap_id`` (see compute_node/sessions.py); SessionMoveError if not."""


def unit_seed(seed: int, round_index: int, unit_id: str) -> int:
    """A seed that depends on the unit, not on the node that runs it (a unit computed
    twice, or by a node that took it over, draws the same numbers)."""
    return (seed * 1_000_003 + round_index * 7919 + zlib.crc32(unit_id.encode())) % (2**31)
