"""What a stream (engine/stream_state.py) hands to the training loop and keeps across a
resume: the versions it asks for, its round ends, where its passes stand and the results
a resumed stream takes up again."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from thrift_trainer.training.units import UnitFailure, UnitResult, UnitSpec, Weights


@dataclass(frozen=True)
class StreamPosition:
    """Where a checkpoint left the passes: the newest pass, and every unit (of any pass)
    whose result the checkpoint's weights do not hold yet, by pass."""

    pass_index: int
    open_units: dict[int, tuple[str, ...]]

    def to_dict(self) -> dict[str, object]:
        return {"pass": self.pass_index,
                "open": {str(p): list(ids) for p, ids in self.open_units.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> StreamPosition:
        open_units = data.get("open", {})
        if not isinstance(open_units, dict) or not isinstance(data.get("pass"), int):
            raise ValueError("a stream position needs 'pass' (int) and 'open' (object)")
        return cls(int(data["pass"]), {int(p): tuple(str(u) for u in ids)
                                       for p, ids in open_units.items()})


def reopened(position: StreamPosition,
             plan_pass: Callable[[int], list[UnitSpec]]) -> list[tuple[int, UnitSpec]]:
    """The units ``position`` holds open, as (pass, unit) in pass and plan order."""
    units = []
    for pass_index in sorted(position.open_units):
        wanted = set(position.open_units[pass_index])
        units += [(pass_index, spec) for spec in plan_pass(pass_index) if spec.unit_id in wanted]
    return units


def position_of(pass_index: int, open_units: Iterable[tuple[int, str]]) -> StreamPosition:
    """A position at pass ``pass_index`` with ``open_units`` as (pass, unit id)."""
    by_pass: dict[int, list[str]] = {}
    for unit_pass, unit_id in open_units:
        by_pass.setdefault(unit_pass, []).append(unit_id)
    return StreamPosition(pass_index, {p: tuple(ids) for p, ids in by_pass.items()})


@dataclass(frozen=True)
class VersionDue:
    """A full buffer: the results (weighted by their staleness) that the next version of
    round ``round`` is made from. The training loop aggregates them and answers with the
    new weights (`StreamState.applied`)."""

    round: int
    results: list[UnitResult]


@dataclass(frozen=True)
class ClientEnd:
    """A federated client's unit settled in an asynchronous round: its result (tensors
    left out) applied in ``version``, or its failure, or its dropping out (no live holder)
    while ``version`` was the newest."""

    version: int
    result: UnitResult | None
    failure: UnitFailure | None = None
    dropped: bool = False


@dataclass
class RoundEnd:
    """A round reached its end: a sync round's update, or an asynchronous round's last
    version. The training loop writes it out."""

    round: int
    version: int
    weights: Weights
    results: int  # results applied during the round
    train_loss: float
    discarded: list[str]
    position: StreamPosition | None  # None for a sync round
    # an asynchronous round's federated clients, in the order they settled (a sync
    # round's are in its outcome)
    clients: list[ClientEnd] = field(default_factory=list)


@dataclass(frozen=True)
class TakenUp:
    """A result kept before the run resumed (coordinator/kept_results.py): applied again,
    in the order it was first kept, as it was then."""

    unit_id: str
    pass_index: int
    staleness: int  # versions behind the newest when it was kept
    update: Weights
    num_samples: int
    loss: float
    node: str | None
