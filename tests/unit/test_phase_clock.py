"""The clock that says where a round's time went (coordinator/phase_clock.py)."""

import time

import pytest

from coordinator.phase_clock import PhaseClock


def test_phases_are_kept_in_the_order_they_first_ran_and_a_repeated_one_adds_up():
    clock = PhaseClock()
    with clock.phase("units"):
        time.sleep(0.02)
    with clock.phase("plan"):
        pass
    with clock.phase("units"):
        time.sleep(0.02)
    assert list(clock.seconds) == ["units", "plan"]
    assert 0.04 <= clock.seconds["units"] < 1.0
    assert clock.seconds["plan"] < clock.seconds["units"]


def test_a_phase_that_raises_is_still_timed():
    clock = PhaseClock()
    with pytest.raises(RuntimeError), clock.phase("aggregate"):
        time.sleep(0.01)
        raise RuntimeError("no feedback")
    assert clock.seconds["aggregate"] >= 0.01


def test_rounded_keeps_microseconds():
    clock = PhaseClock()
    clock.seconds = {"plan": 0.0123456789, "units": 1.5}
    assert clock.rounded() == {"plan": 0.012346, "units": 1.5}
