"""A coordinator's SQLite store makes the engine's hot writes behind the run
(coordinator/sqlite_writes.py): the file still sees every call, in the order made, before
any read, round record or close; a refused call leaves the others of its batch made."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from thrift_trainer.coordinator.run_store import RunStore, UnknownRecord
from thrift_trainer.coordinator.write_behind import Call, WriteBehind

UNITS = ["u1", "u2", "u3"]
A = "node1:9091"
METRICS = dict(validation_error=0.5, validation_loss=1.5, train_loss=1.2, seconds=2.0,
               completed_units=3, discarded_units=0)


def counts(store: RunStore, round_index: int = 1) -> dict[str, int]:
    """The round's units by status, the statuses it has."""
    return {k: v for k, v in store.ledger_counts("r1", round_index).items() if v}


@pytest.fixture
def store(tmp_path: Path):
    with RunStore(tmp_path / "runs.db", defer_writes=True) as s:
        s.create_run("r1", algorithm="delta_avg", model="mlp", dataset="letters", rounds=2)
        s.plan_units("r1", 1, UNITS)
        yield s


def test_deferred_writes_return_nothing_and_reads_see_them(store: RunStore) -> None:
    assert store.unit_started("r1", 1, "u1", 1, A) is None
    assert store.unit_finished("r1", 1, "u1", 1, A, "completed") is None
    store.node_answer("r1", A, "completed", delayed=False, samples=40)
    assert counts(store) == {"completed": 1, "pending": 2}
    assert [n.samples for n in store.node_stats("r1")] == [40]


def test_a_round_is_recorded_after_every_write_of_its_units(store: RunStore) -> None:
    for unit in UNITS:
        store.unit_started("r1", 1, unit, 1, A)
        store.unit_finished("r1", 1, unit, 1, A, "completed")
    # Recording the round cancels what is unsettled: had a "completed" not reached the
    # file before it, that unit would be cancelled.
    assert store.record_round("r1", 1, **METRICS) == 0
    assert counts(store) == {"completed": 3}


def test_close_makes_what_is_queued(tmp_path: Path, store: RunStore) -> None:
    for unit in UNITS:
        store.unit_started("r1", 1, unit, 1, A)
    store.close()
    with RunStore(tmp_path / "runs.db") as again:
        assert counts(again) == {"in_progress": 3}


def test_a_refused_call_leaves_the_rest_of_its_batch_made(
        store: RunStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="coordinator.store"):
        store.unit_started("r1", 1, "u1", 1, A)
        store.unit_finished("r1", 1, "u2", 1, A, "completed")  # never started: refused
        store.unit_started("r1", 1, "u3", 1, A)
        seen = counts(store)  # a read makes what is queued, quietly
    assert seen == {"in_progress": 2, "pending": 1}
    assert "run store refused unit_finished" in caplog.text
    # In strict mode (the tests') the refusal is raised by the next call that waits.
    with pytest.raises(UnknownRecord, match="no attempt 1"):
        store.record_round("r1", 1, **METRICS)


def test_a_batch_makes_its_calls_at_once_in_its_transaction(store: RunStore) -> None:
    with store.batch():
        store.unit_started("r1", 1, "u1", 1, A)
        # inside the batch, the call is made, not queued: this thread holds the store
        assert counts(store) == {"in_progress": 1, "pending": 2}


def test_eight_threads_of_deferred_writes_lose_nothing(store: RunStore) -> None:
    per_thread, errors = 40, []

    def work(t: int) -> None:
        try:
            ids = [f"t{t}-u{i}" for i in range(per_thread)]
            store.plan_units("r1", 2, ids)
            node = f"node{t}:9000"
            for unit in ids:
                store.unit_started("r1", 2, unit, 1, node)
                store.unit_finished("r1", 2, unit, 1, node, "completed")
                store.node_answer("r1", node, "completed", delayed=False, samples=1)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert counts(store, 2) == {"completed": 8 * per_thread}
    assert sum(n.samples for n in store.node_stats("r1")) == 8 * per_thread


def test_the_writer_is_woken_by_a_first_call_and_lets_the_others_gather() -> None:
    """Only a call into an empty queue wakes the writer (which then waits a moment for
    more): one wake per call would cut the batches short at a thread switch each."""
    batches: list[list[Call]] = []
    writes = WriteBehind(batches.append)
    wakes = []
    notify = writes._changed.notify
    writes._changed.notify = lambda *args: (wakes.append(1), notify(*args))[1]
    try:
        with writes._flushing:  # the writer cannot take the queue meanwhile
            for number in range(5):
                writes.put((print, ("r1", number), {}))
            assert len(wakes) == 1
        writes.flush()
        assert [call[1][1] for batch in batches for call in batch] == list(range(5))
    finally:
        writes.close()
