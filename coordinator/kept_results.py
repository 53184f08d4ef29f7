"""Units' results kept in the run store, so that a coordinator taking over a run does not
compute them again.

A new leader (or `--resume`) carries a run on from its last checkpoint, round c, and plans
round c + 1 again. The results that round had already kept were computed from the
checkpoint's weights, so they are as good as new. A store that keeps results (PostgreSQL:
`keeps_results`) holds each one from the moment its round keeps it (written later, with the
ledger's other hot writes: coordinator/write_behind.py) until a checkpoint covers its round,
and the resumed round starts with them, folded in unit order like the others, so a
deterministic run keeps its bits. The ledger says which results are good: the resume leaves
completed exactly the units completed by the attempt whose result is kept (resume_run in
coordinator/run_store.py), reopens the others and forgets every other kept result.

Only a round that starts from a checkpoint keeps its results (every round, with the default
checkpoint_every of 1): a later round's results came from weights that a new leader would
compute again, and round 1's from weights a run without a checkpoint draws again. The
asynchronous modes keep none: their results are applied as they come, each to the version
it reached, so a resumed stream starts from the checkpoint's version and computes them again.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ledger import UnitLedger
from engine.round_state import ResultSink
from engine.tasks import TaskResult, Tensors
from training.algorithms.base import UnitResult, UnitSpec
from training.compression import decompress

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


def packed(tensors: Tensors) -> tuple[str, bytes]:
    """(names, data) of ``tensors`` for the store; the arrays keep their dtypes and bits."""
    buffer = io.BytesIO()
    np.savez(buffer, *tensors.values())
    return json.dumps(list(tensors)), buffer.getvalue()


def unpacked(names: str, data: bytes) -> Tensors:
    """The tensors ``packed`` stored; ValueError when they do not read back."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = [archive[f"arr_{i}"] for i in range(len(archive.files))]
        return dict(zip(json.loads(names), arrays, strict=True))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a kept result does not read back: {exc}") from None


class KeptResults:
    """One run's kept results: what keeps a round's, and what a resumed run takes up."""

    def __init__(self, store: Any, ledger: UnitLedger, run_id: str,
                 checkpoint_due: Callable[[int], bool], resumed_after: int | None) -> None:
        """``store``: the run store (None, or one that keeps no results: nothing is kept);
        ``checkpoint_due(r)``: whether round r ends with a checkpoint; ``resumed_after``:
        the round of the checkpoint a resumed run starts from (None: not resumed)."""
        self._store = store if getattr(store, "keeps_results", False) else None
        self._ledger = ledger
        self.run_id = run_id
        self._checkpoint_due = checkpoint_due
        self._resumed_after = resumed_after

    @property
    def enabled(self) -> bool:
        """Whether the run's store keeps results."""
        return self._store is not None

    def keeper(self, round_index: int) -> ResultSink | None:
        """What keeps round ``round_index``'s results, or None where they are not kept."""
        if not self.enabled or round_index < 2 or not self._checkpoint_due(round_index - 1):
            return None

        def keep(unit: UnitSpec, attempt: int, node: str, result: TaskResult) -> None:
            names, data = packed(result.update)
            self._ledger.keep_result(round_index, unit.unit_id, attempt, node,
                                     result.num_samples, result.loss, names, data)
        return keep

    def taken_up(self, round_index: int, units: list[UnitSpec]) -> dict[str, UnitResult]:
        """The results of ``units`` kept before the run resumed, when ``round_index`` is the
        round it resumes with; by unit id."""
        if not self.enabled or self._resumed_after is None \
                or round_index != self._resumed_after + 1:
            return {}
        specs = {unit.unit_id: unit for unit in units}
        results = {}
        for stored in self._store.kept_results(self.run_id, round_index):
            spec = specs.get(stored.unit_id)
            if spec is not None:  # in deterministic mode, units past the quorum never run
                update = decompress(unpacked(stored.names, stored.data))
                results[spec.unit_id] = UnitResult(spec, update, stored.num_samples,
                                                   stored.loss, stored.node)
        if results:
            log.info("run %s: round %d takes up %d results kept before it resumed",
                     self.run_id, round_index, len(results))
        return results
