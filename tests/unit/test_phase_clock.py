"""The clock that says where a round's time went (engine/phase_clock.py)."""

import pytest

from thrift_trainer.engine.phase_clock import PhaseClock


def _ticks(*times: float):
    """A clock that reads the given times in turn."""
    return iter(times).__next__


def test_phases_are_kept_in_the_order_they_first_ran_and_a_repeated_one_adds_up():
    clock = PhaseClock(_ticks(0.0, 0.02, 0.02, 0.021, 0.03, 0.05))
    with clock.phase("units"):
        pass
    with clock.phase("plan"):
        pass
    with clock.phase("units"):
        pass
    assert list(clock.seconds) == ["units", "plan"]
    assert clock.seconds["units"] == pytest.approx(0.04)
    assert clock.seconds["plan"] == pytest.approx(0.001)


def test_a_phase_that_raises_is_still_timed():
    clock = PhaseClock(_ticks(1.0, 1.25))
    with pytest.raises(RuntimeError), clock.phase("aggregate"):
        raise RuntimeError("no feedback")
    assert clock.seconds["aggregate"] == pytest.approx(0.25)


def test_rounded_keeps_microseconds():
    clock = PhaseClock()
    clock.seconds = {"plan": 0.0123456789, "units": 1.5}
    assert clock.rounded() == {"plan": 0.012346, "units": 1.5}
