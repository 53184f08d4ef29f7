"""The one type check of a run config's values (training/config_types.py) and the one
check of a run's rounds (training/schema.py)."""

from __future__ import annotations

import pytest

from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.schema import MAX_ROUNDS, rounds_problem


@pytest.mark.parametrize("value, default, expected", [
    (3, 0.5, 3.0), (True, False, True), ("x", "", "x"), ([1, 2], [20], [1, 2]),
    ({"a": 1}, {}, {"a": 1}), (object, None, object), (2.5, 1.0, 2.5),
])
def test_a_value_of_its_defaults_type_is_taken(value, default, expected):
    checked = checked_value("k", value, default)
    assert checked == expected and type(checked) is type(expected)


@pytest.mark.parametrize("value, default, message", [
    (True, 1, "k must be an integer, got True"),
    (1, False, "k must be a boolean (true or false), got 1"),
    (True, 1.0, "k must be a number, got True"),
    (2.5, 1, "k must be an integer, got 2.5"),
    ("1", 1.0, "k must be a number, got '1'"),
    ([1, 2.5], [20], "k must be a list of integers, got [1, 2.5]"),
    ({1: 2}, {}, "k must be a mapping, got {1: 2}"),
    (10**400, 1.0, "k is out of range, got an integer of 401 digits"),
])
def test_a_value_of_another_type_is_refused_naming_the_key_in_words(value, default, message):
    with pytest.raises(ValueError) as info:
        checked_value("k", value, default)
    assert message in str(info.value)


def test_the_error_is_the_callers_own():
    class SectionError(ValueError):
        pass
    with pytest.raises(SectionError, match="data.channels must be an integer"):
        checked_value("data.channels", "3", 1, SectionError)


@pytest.mark.parametrize("rounds, most, problem", [
    (5, MAX_ROUNDS, None), (MAX_ROUNDS, MAX_ROUNDS, None),
    (0, MAX_ROUNDS, "0 is out of range 1..2147483647 (rounds travel as a 32-bit field)"),
    (MAX_ROUNDS + 1, MAX_ROUNDS, "2147483648 is out of range 1..2147483647"),
    (None, MAX_ROUNDS, "an integer is required, got None"),
    (True, MAX_ROUNDS, "an integer is required, got True"),
    (4, 3, "4 is out of range 1..3"),
])
def test_rounds_are_checked_in_one_place(rounds, most, problem):
    found = rounds_problem(rounds, most)
    assert found == problem if problem is None else problem in found
