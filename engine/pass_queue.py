"""Synchronous rounds that draw their units from passes over the data.

For an algorithm whose rounds take a slice of the data set (`sync_sgd`: N index ranges per
iteration, of which the first K results are used), a round's units come from the TODO of
the current pass (`Algorithm.plan_pass`), N at a time. The units a round did not use (cut
by K-of-N, or never sent in deterministic mode) go back to the front of TODO, so every
unit of a pass is trained on once before the next pass begins; a unit discarded after its
failures is done for this pass. With K = N nothing goes back and the units are exactly
those of consecutive rounds. The checkpoint holds the queue (as a `StreamPosition`), so a
resumed run draws the same units.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from thrift_trainer.engine import runtime
from thrift_trainer.engine.stream_records import StreamPosition, position_of, reopened
from thrift_trainer.training.units import UnitSpec


class PassQueue:
    """TODO of the current pass (and units put back from earlier ones), for sync rounds."""

    def __init__(self, plan_pass: Callable[[int], list[UnitSpec]],
                 position: StreamPosition | None = None) -> None:
        self._plan_pass = plan_pass
        self._lock = runtime.Lock()
        self._todo: deque[tuple[int, UnitSpec]] = deque()
        self._pass = 0
        self._done_in_pass = 0
        self._round: list[tuple[int, UnitSpec]] = []  # taken by the round in progress
        if position is not None:
            self._pass = position.pass_index
            self._todo.extend(reopened(position, plan_pass))

    def take(self, count: int) -> list[UnitSpec]:
        """The next ``count`` units, starting new passes as TODO runs empty."""
        with self._lock:
            taken: list[tuple[int, UnitSpec]] = []
            while len(taken) < count:
                if not self._todo:
                    self._pass += 1
                    self._done_in_pass = 0
                    self._todo.extend((self._pass, s) for s in self._plan_pass(self._pass))
                taken.append(self._todo.popleft())
            self._round = taken
            return [spec for _, spec in taken]

    def settle(self, used: Iterable[str]) -> None:
        """The round is over: its units not in ``used`` (results kept, or units discarded)
        go back to the front of TODO, in their order."""
        used = set(used)
        with self._lock:
            back = [(p, spec) for p, spec in self._round if spec.unit_id not in used]
            self._done_in_pass += sum(1 for p, spec in self._round
                                      if spec.unit_id in used and p == self._pass)
            self._todo.extendleft(reversed(back))
            self._round = []

    def position(self) -> StreamPosition:
        """What a checkpoint keeps: the pass and every unit still to do, by pass."""
        with self._lock:
            return position_of(self._pass, ((p, spec.unit_id) for p, spec in self._todo))

    def counts(self) -> dict[str, int]:
        """The pass and its units: todo, pending (in the round in progress), done."""
        with self._lock:
            return {"pass": self._pass, "todo": len(self._todo), "pending": len(self._round),
                    "done": self._done_in_pass}
