"""Sync rounds drawn from passes over the data: units cut by K-of-N come round again."""

from __future__ import annotations

from thrift_trainer.engine.pass_queue import PassQueue
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT

# the letter rows in units of 2,000: a pass is units_per_epoch units
ALGORITHM = SyncSGD("mlp", {"images_per_work_unit": 2000, "num_workunits_per_update": 2,
                            "units_per_iteration": 3}, DEFAULT_DATA_ROOT / "letters")


def ids(units) -> list[str]:
    return [u.unit_id for u in units]


def test_with_k_equal_n_the_rounds_are_the_plain_rounds():
    queue = PassQueue(ALGORITHM.plan_pass)
    for round_index in range(1, 6):  # across two pass boundaries
        taken = queue.take(3)
        assert ids(taken) == ids(ALGORITHM.plan_round(round_index))
        queue.settle(ids(taken))


def test_units_the_round_did_not_use_come_first_in_the_next_round():
    queue = PassQueue(ALGORITHM.plan_pass)
    first = queue.take(3)
    queue.settle([first[0].unit_id, first[2].unit_id])  # the first 2 of 3 to arrive
    second = queue.take(3)
    assert second[0] == first[1]  # the one cut by K-of-N, before any new unit
    assert ids(second[1:]) == ["unit3-6000-8000", "unit4-8000-10000"]
    assert queue.counts() == {"pass": 1, "todo": ALGORITHM.units_per_epoch - 5,
                              "pending": 3, "done": 2}
    queue.settle(ids(second))
    assert queue.counts()["done"] == 5


def test_every_unit_of_a_pass_is_trained_once_before_the_next_pass():
    queue = PassQueue(ALGORITHM.plan_pass)
    used: list[str] = []
    for _ in range(6):
        taken = queue.take(3)
        queue.settle(ids(taken[:2]))  # the last unit of every round is cut
        used += ids(taken[:2])
    per_pass = ALGORITHM.units_per_epoch
    assert len(set(used[:per_pass])) == per_pass  # no repeats, none skipped
    assert {int(u.split("-")[0][4:]) for u in used[:per_pass]} == set(range(per_pass))


def test_a_position_restores_the_queue():
    queue = PassQueue(ALGORITHM.plan_pass)
    taken = queue.take(3)
    queue.settle(ids(taken[1:]))
    restored = PassQueue(ALGORITHM.plan_pass, queue.position())
    assert ids(restored.take(5)) == ids(queue.take(5))
