"""Units go back to the node holding their slot's topk residual."""

from __future__ import annotations

from thrift_trainer.engine.residual_placement import ResidualPlacement
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.units import UnitSpec


def _units(round_index: int) -> list[UnitSpec]:
    """sync_sgd-like ids: unit<number>-<start>-<stop>, 3 a round, numbers running on."""
    return [UnitSpec(f"unit{(round_index - 1) * 3 + j}-0-32", "f") for j in range(3)]


def _slot(unit: UnitSpec) -> str:
    return get_algorithm("sync_sgd").unit_slot(unit, {"units_per_iteration": 3})


def test_a_slot_goes_back_to_the_node_that_computed_it() -> None:
    placement = ResidualPlacement(_slot)
    first = placement.prefer(_units(1))
    assert [u.preferred_node for u in first] == [None, None, None]  # nothing known yet
    placement.note(first, {"unit0-0-32": "a:1", "unit2-0-32": "c:3"})  # unit1 not used
    second = placement.prefer(_units(2))  # unit3, unit4, unit5: slots 0, 1, 2
    assert [u.preferred_node for u in second] == ["a:1", None, "c:3"]
    placement.note(second, {"unit3-0-32": "b:2", "unit4-0-32": "b:2", "unit5-0-32": "c:3"})
    assert [u.preferred_node for u in placement.prefer(_units(3))] == ["b:2", "b:2", "c:3"]


def test_a_preference_of_the_algorithm_is_kept() -> None:
    placement = ResidualPlacement(lambda unit: unit.unit_id)
    placement.note([UnitSpec("u", "f")], {"u": "a:1"})
    own = UnitSpec("u", "f", preferred_node="d:4")  # e.g. MD-GAN's session holder
    assert placement.prefer([own, UnitSpec("u", "f")]) == [
        own, UnitSpec("u", "f", preferred_node="a:1")]
