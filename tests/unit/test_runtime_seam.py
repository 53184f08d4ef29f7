"""The engine reads time and randomness, and waits and starts threads, only through
engine/runtime.py: what a simulation replaces to run it on a virtual clock with a seeded
scheduler. These tests read the sources, and check the standard runtime's vocabulary."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest

from tests.waiting import wait_until
from thrift_trainer.engine import runtime

REPO = Path(__file__).resolve().parents[2]
# The engine, and the coordinator's run loop and run store that the simulator runs with it.
SOURCES = sorted((REPO / "engine").rglob("*.py")) + [REPO / "coordinator" / "run.py",
                                                    REPO / "coordinator" / "training_loop.py",
                                                    REPO / "coordinator" / "run_tasks.py",
                                                    REPO / "coordinator" / "run_store.py"]
SEAM = REPO / "engine" / "runtime.py"
# Modules whose clocks, threads, waits or random numbers would escape the runtime.
FORBIDDEN = {"time", "threading", "random", "secrets", "uuid", "concurrent", "asyncio",
             "datetime", "multiprocessing", "queue", "sched", "signal"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", [p for p in SOURCES if p != SEAM],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_engine_uses_no_clock_thread_or_random_source_but_the_runtime(path: Path) -> None:
    escaping = sorted(imported_modules(path) & FORBIDDEN)
    assert escaping == [], (f"{path.relative_to(REPO)} imports {escaping}: use "
                            "engine.runtime (runtime.monotonic(), runtime.Event(), ...)")


def test_the_seam_covers_what_the_engine_used_before() -> None:
    assert SEAM in sorted((REPO / "engine").rglob("*.py"))
    assert imported_modules(SEAM) >= {"time", "threading", "random"}


def test_the_system_runtime_is_the_standard_library() -> None:
    assert runtime.current() is runtime.SYSTEM
    assert abs(runtime.monotonic() - time.monotonic()) < 1.0
    assert abs(runtime.wall() - time.time()) < 1.0
    assert isinstance(runtime.Event(), threading.Event)
    assert runtime.Random(7).random() == runtime.Random(7).random()
    assert len(runtime.token_hex(16)) == 32


def test_another_runtime_is_the_engines_only_while_installed() -> None:
    class Frozen(runtime.SystemRuntime):
        def monotonic(self) -> float:
            return 42.0

    with runtime.installed(Frozen()):
        assert runtime.monotonic() == 42.0
    assert runtime.current() is runtime.SYSTEM


def test_parallel_map_keeps_the_order_and_raises_the_first_error() -> None:
    assert runtime.parallel_map(lambda x: x * x, list(range(10)), threads=3,
                                name="test") == [x * x for x in range(10)]

    def fail_on_three(x: int) -> int:
        if x == 3:
            raise ValueError("three")
        return x

    with pytest.raises(ValueError, match="three"):
        runtime.parallel_map(fail_on_three, list(range(5)), threads=2, name="test")


def test_a_submitted_task_says_when_it_is_done_even_when_it_raises() -> None:
    release = runtime.Event()

    def blocked() -> None:
        release.wait(5)
        raise RuntimeError("a failed heartbeat")

    task = runtime.submit(blocked, name="test")
    assert not task.done()
    release.set()
    assert task.wait(5) and task.done()


def test_the_system_runtime_runs_a_thread_per_target_and_wakes_a_finished_one() -> None:
    """Targets started together run at once, each under its name; once they have ended,
    the next target runs in one of their threads instead of a new one."""
    barrier = threading.Barrier(5, timeout=10)
    ran: list[str] = []

    def meet() -> None:
        barrier.wait()  # all five must be running at once for any to pass
        ran.append(threading.current_thread().name)

    for i in range(5):
        runtime.start_thread(meet, f"meet-{i}")
    assert wait_until(lambda: len(ran) == 5, 10)
    assert sorted(ran) == [f"meet-{i}" for i in range(5)]
    assert wait_until(_runs_in_a_thread_that_was_there, 10)


def _runs_in_a_thread_that_was_there() -> bool:
    """Start a target; whether it ran in a thread alive before it was started."""
    before = {thread.ident for thread in threading.enumerate()}
    ident: list[int | None] = []
    runtime.start_thread(lambda: ident.append(threading.get_ident()), "again")
    assert wait_until(lambda: bool(ident), 10)
    return ident[0] in before


def test_a_cached_thread_reports_its_targets_exception_and_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[tuple[type, str]] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: reported.append((args.exc_type, args.thread.name)))

    def fail() -> None:
        raise ValueError("boom")

    runtime.start_thread(fail, "failing")
    assert wait_until(lambda: reported == [(ValueError, "failing")], 10)
    done = threading.Event()
    runtime.start_thread(done.set, "after")
    assert done.wait(10)

