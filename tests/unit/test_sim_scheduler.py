"""The simulation's scheduler (devtools/simulation/scheduler.py): virtual time, one thread
at a time, the same sequence for the same seed, hangs detected, threads unwound."""

from __future__ import annotations

import threading

import pytest

from devtools.simulation.scheduler import SimHang, SimRuntime
from thrift_trainer.engine import runtime


def simulate(seed: int, main, max_time: float = 1e6) -> SimRuntime:
    sim = SimRuntime(seed)
    with runtime.installed(sim):
        sim.run(main, max_time)
    return sim


def interleaved(seed: int) -> tuple[list[str], str]:
    """Three threads that take turns on a lock and sleep: the order they log in."""
    log: list[str] = []

    def main() -> None:
        lock, done = runtime.Lock(), runtime.Condition()
        finished = []

        def worker(name: str) -> None:
            for step in range(4):
                with lock:
                    log.append(f"{name}{step}")
                runtime.sleep(0.5 if name == "a" else 0.3)
            with done:
                finished.append(name)
                done.notify_all()

        for name in "abc":
            runtime.start_thread(worker, name, args=(name,))
        with done:
            done.wait_for(lambda: len(finished) == 3)

    sim = simulate(seed, main)
    return log, sim.trace_digest()


def test_a_seed_gives_one_exact_sequence_and_another_seed_another() -> None:
    first, trace = interleaved(3)
    assert interleaved(3) == (first, trace)
    orders = {tuple(interleaved(seed)[0]) for seed in range(8)}
    assert len(orders) > 1  # the scheduler does explore interleavings
    assert sorted(first) == sorted(f"{n}{s}" for n in "abc" for s in range(4))


def test_time_is_virtual_and_jumps_to_the_next_deadline() -> None:
    seen = []

    def main() -> None:
        runtime.sleep(3600)  # an hour, at once
        seen.append(runtime.monotonic())
        event = runtime.Event()
        runtime.start_thread(lambda: (runtime.sleep(2.5), event.set()), "setter")
        assert event.wait(10)
        seen.append(runtime.monotonic())
        assert not runtime.Event().wait(1.0)  # a timeout is one second of virtual time
        seen.append(runtime.monotonic())

    simulate(1, main)
    assert seen == [3600.0, 3602.5, 3603.5]
    assert runtime.current() is runtime.SYSTEM  # the real clock again, outside it


def test_a_simulation_where_everyone_waits_forever_hangs_with_a_reason() -> None:
    def main() -> None:
        runtime.start_thread(lambda: runtime.Event().wait(), "stuck")
        runtime.Event().wait()

    with pytest.raises(SimHang, match="every thread waits and none has a deadline"):
        simulate(1, main)


def test_a_simulation_past_its_time_bound_hangs() -> None:
    def main() -> None:
        while True:
            runtime.sleep(60)

    with pytest.raises(SimHang, match="virtual time would pass 600s"):
        simulate(1, main, max_time=600)


def test_threads_still_waiting_at_the_end_are_unwound_with_their_finally_blocks() -> None:
    cleaned = []
    before = threading.active_count()

    def waiter(i: int) -> None:
        try:
            runtime.Event().wait()
        finally:
            cleaned.append(i)

    def main() -> None:
        for i in range(5):
            runtime.start_thread(waiter, f"waiter{i}", args=(i,))
        runtime.sleep(1)

    simulate(1, main)
    assert sorted(cleaned) == list(range(5))
    assert threading.active_count() <= before + 1  # the real threads ended too (or are ending)


def test_an_error_a_thread_does_not_handle_is_kept_for_the_checks() -> None:
    def main() -> None:
        runtime.start_thread(lambda: 1 / 0, "divider")
        runtime.sleep(1)

    sim = simulate(1, main)
    assert [(name, type(exc)) for name, exc in sim.errors] == [("divider", ZeroDivisionError)]


def test_conditions_locks_and_events_keep_their_standard_meaning() -> None:
    def main() -> None:
        rlock = runtime.RLock()
        with rlock, rlock:  # re-entrant
            pass
        lock = runtime.Lock()
        lock.acquire()
        assert not lock.acquire(blocking=False)
        got = []
        runtime.start_thread(lambda: got.append(lock.acquire(timeout=2.0)), "taker")
        runtime.sleep(5)
        assert got == [False]  # timed out while held
        lock.release()
        condition = runtime.Condition()
        with condition:
            assert not condition.wait(0.5)  # nobody notifies: a timeout
        assert runtime.monotonic() == pytest.approx(5.5)

    simulate(2, main)


def test_random_numbers_and_secrets_come_from_the_seed() -> None:
    def draws() -> list:
        out = []
        simulate(9, lambda: out.extend([runtime.Random().random(), runtime.token_hex(8),
                                        runtime.Random(5).random()]))
        return out

    first = draws()
    assert draws() == first
    assert first[2] == runtime.SYSTEM.random(5).random()  # an explicit seed stays as given
