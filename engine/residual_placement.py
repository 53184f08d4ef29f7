"""Units go back to the node that holds their slot's error feedback residual.

With ``topk`` updates (training/compression.py) a node keeps what it did not send under
``residual/<slot>`` of the run (slot: `Algorithm.unit_slot`) and adds it to its next
update of that slot. A slot's unit computed on another node would start a second residual
there and leave the first one waiting, so after each round the run notes which node
computed each slot, and the next round names that node as the unit's preferred one
(`UnitSpec.preferred_node`; the engine falls back to any node when it is gone, benched or
refuses). One place for every algorithm whose updates can travel as topk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from thrift_trainer.training.units import UnitSpec


class ResidualPlacement:
    """Slot -> the node ("host:port") whose session holds that slot's residual."""

    def __init__(self, slot_of: Callable[[UnitSpec], str]) -> None:
        self._slot_of = slot_of
        self.nodes: dict[str, str] = {}

    def prefer(self, units: Sequence[UnitSpec]) -> list[UnitSpec]:
        """The units, each naming its slot's node as preferred, unless the algorithm
        already chose one (MD-GAN's sessions) or the slot has not run yet."""
        return [replace(unit, preferred_node=self.nodes[self._slot_of(unit)])
                if unit.preferred_node is None and self._slot_of(unit) in self.nodes
                else unit for unit in units]

    def note(self, units: Sequence[UnitSpec], placement: Mapping[str, str]) -> None:
        """Record where a round's results were computed (unit id -> node): those nodes
        now hold the residuals of their units' slots."""
        for unit in units:
            node = placement.get(unit.unit_id)
            if node is not None:
                self.nodes[self._slot_of(unit)] = node
