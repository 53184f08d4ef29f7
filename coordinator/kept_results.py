"""Units' results kept in the run store, so that a coordinator taking over a run does not
compute them again.

A new leader (or `--resume`) carries a run on from its last checkpoint, round c. The
results round c + 1 had already kept were computed from the checkpoint's weights (or, in
the asynchronous modes, from the versions made since, which are made again from them), so
they are as good as new. A store that keeps results (a ResultKeeper: PostgreSQL's) holds
each one from the moment its round keeps it (written later, with the ledger's other hot
writes: coordinator/write_behind.py) until a checkpoint covers its round. The ledger says
which are good: the resume leaves completed exactly the units completed by the attempt
whose result is kept (resume_run in coordinator/sql_ledger.py), reopens the others and
forgets every other kept result.

- A round (sync) starts with them and sends out only the other units; folded in unit
  order like the rest, they leave a deterministic run's bits as they were.
- A stream (async, buffered) keeps them again in the order they were first kept, each
  with the staleness it had, so the versions they made are made again as they were
  (engine/stream_state.py); a stream's results count only up to the first one whose
  keeping the leader's death cut off, since the versions after it cannot be made again.

Only a round that starts from a checkpoint keeps its results (every round, with the
default checkpoint_every of 1): a later round's came from weights that a new leader would
compute again, and round 1's from weights a run without a checkpoint draws again.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from thrift_trainer.coordinator.store_protocol import ResultKeeper, Store
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.round_state import Kept
from thrift_trainer.engine.stream_records import TakenUp
from thrift_trainer.engine.tasks import Tensors
from thrift_trainer.training.compression import decompress
from thrift_trainer.training.outputs.checked_npz import read_npz
from thrift_trainer.training.units import UnitResult, UnitSpec

log = logging.getLogger("coordinator.run")


@dataclass(frozen=True)
class StoredResult:
    """A kept result as the store holds it."""

    unit_id: str
    attempt: int
    node: str
    num_samples: int
    loss: float
    names: str  # the tensors' names as a JSON list, in the order of data's arrays
    data: bytes  # the tensors (as the node sent them: possibly compressed), as an .npz
    sequence: int | None = None  # a stream's: its place among its round's results
    staleness: int | None = None  # a stream's: versions behind when it was kept
    pass_index: int | None = None  # a stream's: the pass of its unit


def packed(tensors: Tensors) -> tuple[str, bytes]:
    """(names, data) of ``tensors`` for the store; the arrays keep their dtypes and bits."""
    buffer = io.BytesIO()
    np.savez(buffer, *tensors.values())
    return json.dumps(list(tensors)), buffer.getvalue()


def unpacked(names: str, data: bytes) -> Tensors:
    """The tensors ``packed`` stored; ValueError when they do not read back."""
    try:
        archive = read_npz(data, "a kept result")
        arrays = [archive[f"arr_{i}"] for i in range(len(archive))]
        return dict(zip(json.loads(names), arrays, strict=True))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a kept result does not read back: {exc}") from None


class KeptResults:
    """One run's kept results: what keeps a round's, and what a resumed run takes up."""

    def __init__(self, store: Store | None, ledger: UnitLedger, run_id: str,
                 checkpoint_due: Callable[[int], bool], resumed_after: int | None) -> None:
        """``store``: the run store (None, or one that keeps no results: nothing is kept);
        ``checkpoint_due(r)``: whether round r ends with a checkpoint; ``resumed_after``:
        the round of the checkpoint a resumed run starts from (None: not resumed)."""
        self._store: ResultKeeper | None = store if isinstance(store, ResultKeeper) else None
        self._ledger = ledger
        self.run_id = run_id
        self._checkpoint_due = checkpoint_due
        self._resumed_after = resumed_after

    @property
    def enabled(self) -> bool:
        """Whether the run's store keeps results."""
        return self._store is not None

    def keeps(self, round_index: int) -> bool:
        """Whether round ``round_index``'s results are kept: it starts from a checkpoint."""
        return self.enabled and round_index >= 2 and self._checkpoint_due(round_index - 1)

    def keep(self, kept: Kept) -> None:
        """Keep a result a round or stream kept, where its round's results are kept."""
        if self.keeps(kept.round):
            names, data = packed(kept.result.update)
            self._ledger.keep_result(kept.round, kept.unit.unit_id, kept.attempt, kept.node,
                                     kept.result.num_samples, kept.result.loss, names, data,
                                     kept.sequence, kept.staleness)

    def taken_up(self, round_index: int, units: list[UnitSpec]) -> dict[str, UnitResult]:
        """The results of a round's ``units`` kept before the run resumed, when it is the
        round the run resumes with; by unit id."""
        specs = {unit.unit_id: unit for unit in units}
        results = {}
        for stored in self._stored(round_index):
            spec = specs.get(stored.unit_id)
            if spec is not None:  # in deterministic mode, units past the quorum never run
                results[spec.unit_id] = UnitResult(spec, _update(stored), stored.num_samples,
                                                   stored.loss, stored.node)
        return results

    def taken_up_stream(self, round_index: int) -> list[TakenUp]:
        """The results an asynchronous run's round had kept before the run resumed (when
        it is the round the run resumes with), in the order they were kept."""
        return [TakenUp(s.unit_id, s.pass_index or 1, s.staleness or 0, _update(s),
                        s.num_samples, s.loss, s.node) for s in self._stored(round_index)]

    def _stored(self, round_index: int) -> list[StoredResult]:
        if not self.enabled or self._resumed_after is None \
                or round_index != self._resumed_after + 1:
            return []
        stored = self._store.kept_results(self.run_id, round_index)
        if stored:
            log.info("run %s: round %d takes up %d results kept before it resumed",
                     self.run_id, round_index, len(stored))
        return stored


def _update(stored: StoredResult) -> Tensors:
    return decompress(unpacked(stored.names, stored.data))
