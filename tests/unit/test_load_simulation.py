"""The assignment's load semantics, measured over many seeded draws."""

from __future__ import annotations

import pytest

from thrift_trainer.compute_node.load import LoadSimulator


def rates(policy: int, load: float, draws: int = 4000) -> tuple[float, float]:
    sim = LoadSimulator(load, load_delay=3.0, seed=5)
    decisions = [sim.admit(policy) for _ in range(draws)]
    accepted = [d for d in decisions if not d.rejected]
    rejected = 1 - len(accepted) / draws
    delayed = sum(d.delay_seconds == 3.0 for d in accepted) / len(accepted)
    return rejected, delayed


def test_random_policy_never_rejects_and_delays_with_the_load():
    rejected, delayed = rates(policy=1, load=0.3)
    assert rejected == 0
    assert delayed == pytest.approx(0.3, abs=0.03)


@pytest.mark.parametrize("policy", [2, 3])
def test_load_balancing_rejects_then_still_delays(policy):
    rejected, delayed = rates(policy=policy, load=0.4)
    assert rejected == pytest.approx(0.4, abs=0.03)
    assert delayed == pytest.approx(0.4, abs=0.03)


def test_zero_load_never_waits_and_full_load_always_rejects():
    assert rates(2, 0.0)[0:2] == (0.0, 0.0)
    assert all(LoadSimulator(1.0, 1.0).admit(2).rejected for _ in range(50))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="between 0 and 1"):
        LoadSimulator(1.2, 3.0)
    with pytest.raises(ValueError, match="unknown scheduling policy 4"):
        LoadSimulator(0.1, 3.0).admit(4)
