"""A private run's budget counts the releases the run store charged it
(coordinator/privacy_budget.py, coordinator/ledger_charges.py): a round computed twice
after a crash counts twice where each computation was seen (distributed DP), once where
only one could leave (central DP), the target stops such a run a round earlier, and the
status of a run read from the store shows its epsilon as a live run's does."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrift_trainer.coordinator.privacy_budget import EPSILON, PrivacyBudget
from thrift_trainer.coordinator.run_store import RunStore
from thrift_trainer.coordinator.status_wire import run_status
from thrift_trainer.coordinator.stored_status import stored_status
from thrift_trainer.engine.work_queue import RoundFailed
from thrift_trainer.training.privacy import accounting
from thrift_trainer.training.privacy.accounting import FIXED, Sampling
from thrift_trainer.training.schema import PrivacySettings

SETTINGS = PrivacySettings(clip=0.5, noise_multiplier=1.1, delta=0.001)
SAMPLING = Sampling(FIXED, 12, 4)


class PrivateAlgorithm:
    """What the budget reads of a private algorithm: its settings and its sampling."""

    def __init__(self, settings: PrivacySettings = SETTINGS) -> None:
        self.privacy = settings

    def privacy_sampling(self) -> Sampling:
        return SAMPLING


def epsilon(releases: int) -> float:
    return accounting.epsilon(SETTINGS, SAMPLING, releases)


@pytest.fixture
def store(tmp_path: Path):
    with RunStore(tmp_path / "runs.db") as opened:
        opened.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters",
                          rounds=4)
        yield opened


def _resumed(store: RunStore, after: int) -> None:
    store.end_run("r1", "failed", "killed")
    store.resume_run("r1", after)


def test_a_secure_round_computed_twice_is_charged_twice_through_a_resume(
        store: RunStore) -> None:
    budget = PrivacyBudget(PrivateAlgorithm(), store, "r1", each_computation=True)
    for round_index in (1, 2, 3):  # killed after round 3's unmask, before it was written
        budget.charge(round_index)
    assert budget.figures(2)[EPSILON] == epsilon(3)  # what it charged, not the round index
    _resumed(store, 2)
    again = PrivacyBudget(PrivateAlgorithm(), store, "r1", each_computation=True)
    again.charge(3)
    assert again.figures(3)[EPSILON] == epsilon(4)
    again.charge(4)
    assert again.figures(4)[EPSILON] == epsilon(5)
    assert [(c.round, c.epsilon) for c in store.privacy_charges("r1")] == [
        (1, epsilon(1)), (2, epsilon(2)), (3, epsilon(3)), (3, epsilon(4)), (4, epsilon(5))]


def test_a_central_round_computed_again_is_charged_once(store: RunStore) -> None:
    """Central DP: the first computation left nothing (its weights leave after the
    checkpoint) and the second has the same noise: one release."""
    budget = PrivacyBudget(PrivateAlgorithm(), store, "r1")
    for round_index in (1, 2, 3):
        budget.charge(round_index)
    _resumed(store, 2)
    again = PrivacyBudget(PrivateAlgorithm(), store, "r1")
    again.charge(3)
    assert again.figures(3)[EPSILON] == epsilon(3)
    again.charge(4)
    assert [c.round for c in store.privacy_charges("r1")] == [1, 2, 3, 4]
    assert again.figures(4)[EPSILON] == epsilon(4)


def test_a_run_charged_an_extra_release_stops_one_round_earlier(store: RunStore) -> None:
    target = PrivacySettings(clip=0.5, noise_multiplier=1.1, delta=0.001,
                             target_epsilon=(epsilon(3) + epsilon(4)) / 2)
    plain = PrivacyBudget(PrivateAlgorithm(target), None, "r1", each_computation=True)
    plain.check_round(3, [])  # three releases fit, four do not
    with pytest.raises(RoundFailed, match="stops after 3 rounds"):
        plain.check_round(4, [])
    budget = PrivacyBudget(PrivateAlgorithm(target), store, "r1", each_computation=True)
    budget.charge(1)
    budget.charge(2)
    budget.charge(2)  # round 2 seen twice
    with pytest.raises(RoundFailed, match="round 3 would spend epsilon"):
        budget.check_round(3, [])


def test_a_budget_without_a_store_counts_its_charges_in_memory() -> None:
    budget = PrivacyBudget(PrivateAlgorithm(), None, "r1", each_computation=True)
    budget.charge(1)
    budget.charge(1)
    assert budget.figures(1)[EPSILON] == epsilon(2)


def test_a_stored_private_run_shows_its_epsilon_as_a_live_one_does(store: RunStore) -> None:
    budget = PrivacyBudget(PrivateAlgorithm(), store, "r1", each_computation=True)
    budget.charge(1)
    budget.charge(1)
    status = stored_status(store, store.get_run("r1"), suspect_seconds=5.0,
                           dead_seconds=30.0)
    assert status.clients == {EPSILON: epsilon(2)}
    assert run_status(status).clients == {EPSILON: epsilon(2)}  # and the wire keeps it


def test_a_stored_run_without_privacy_shows_no_epsilon(store: RunStore) -> None:
    status = stored_status(store, store.get_run("r1"), suspect_seconds=5.0,
                           dead_seconds=30.0)
    assert status.clients is None
