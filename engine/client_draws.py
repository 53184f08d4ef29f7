"""Which federated client an asynchronous run trains next (buffered asynchronous
aggregation, FedBuff: Nguyen et al. 2022).

A stream with clients (engine/stream_state.py) does not run passes over the data: it keeps
`concurrency` clients training at once, and each time one leaves (its result kept, or it
failed or dropped out) it draws another, uniformly among the clients a node of the run
holds that are not training now (training/clients/sampling.py's `stream_draw`, seeded by
the run's seed, the newest version and the draw's number, so a resumed run draws the same
from the same state). Each draw is a unit of its own, ``<client>.d<draw>``, whose number
the stream keeps as the unit's pass: a checkpoint's position names the draws still open
and rebuilds them from their ids alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from thrift_trainer.training.clients.sampling import stream_draw
from thrift_trainer.training.units import UnitSpec

DRAW_MARK = ".d"


class ClientDraws:
    """The clients a stream draws from and how many of them train at once."""

    def __init__(self, seed: int, units: Callable[[], list[UnitSpec]],
                 held: Callable[[str], bool], concurrency: Callable[[int], int]) -> None:
        """``units``: one unit per client with examples (the algorithm's, read at each draw:
        node-resident clients are known only once their nodes announce them); ``held``:
        whether a node of the run holds a client now; ``concurrency``: clients training at
        once, given how many units the nodes take at once."""
        self.seed = seed
        self._units, self._held, self._concurrency = units, held, concurrency

    def size(self) -> int:
        """Clients there are to draw from (a pass's worth of draws, for failure counts)."""
        return max(1, len(self._units()))

    def concurrency(self, capacity: int) -> int:
        return max(1, min(capacity, self._concurrency(capacity)))

    def draw(self, version: int, draw_index: int, busy: Iterable[str]) -> UnitSpec | None:
        """Draw ``draw_index``'s unit at ``version``, a client not in ``busy`` (training
        now, or dropped out of the round); None when every held client is busy."""
        excluded = set(busy)
        by_client = {unit.client: unit for unit in self._units() if unit.client is not None}
        candidates = [name for name in by_client
                      if name not in excluded and self._held(name)]
        chosen = stream_draw(self.seed, version, draw_index, candidates)
        if chosen is None:
            return None
        return replace(by_client[chosen], unit_id=f"{chosen}{DRAW_MARK}{draw_index}")

    def spec_of(self, unit_id: str) -> UnitSpec:
        """The unit a draw's id names (a resume reopens it); ValueError for another id."""
        client, mark, number = unit_id.rpartition(DRAW_MARK)
        unit = next((u for u in self._units() if u.client == client), None)
        if not mark or not number.isdigit() or unit is None:
            raise ValueError(f"{unit_id!r} names no client draw of this run")
        return replace(unit, unit_id=unit_id)
