"""A virtual clock and a seeded scheduler that runs one thread at a time: `SimRuntime`.

Installed as the engine's runtime (`engine.runtime.installed`), it makes a run of the real
engine deterministic: every thread the engine starts is a real thread, but only the one
holding the baton runs; it hands the baton on only where it would wait (a lock held by
another, a condition, an event, a sleep) or at a point the scheduler chooses to preempt it
(taking a lock, notifying, setting an event). The next thread is drawn among the runnable
ones with a generator seeded by the simulation's seed, in the order the threads were
started; when none is runnable, the virtual clock jumps to the earliest deadline of a
waiting thread. So one seed gives one exact sequence of events, whatever the machine, and
no time passes but virtual time: a minute of heartbeats and deadlines costs nothing.

When every thread waits with no deadline, nothing can ever happen again: the simulation
has hung, and `SimHang` is raised in the driving thread (the one that called `run`). When
the driver's function returns, the threads still waiting are stopped with `SimStopped`
raised where they wait (a `BaseException`, so that code catching `Exception` lets it
through), so that no thread outlives its simulation.

Every decision is written to a SHA-256 trace (`trace_digest`): thread starts, switches,
clock jumps and the events the simulated system records (`note`). Two runs of a seed
have equal traces exactly when they did the same things in the same order.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable
from typing import Any

EPOCH = 1_800_000_000.0  # the wall clock's reading at virtual time 0 (2027-01-15)
PREEMPT = 0.15  # chance that taking a lock, notifying or setting an event lets another run
MAX_SWITCHES_AT_ONE_TIME = 100_000  # more while virtual time stands still: a livelock


class SimHang(Exception):
    """Every thread of the simulation waits and none has a deadline: nothing can happen."""


class SimStopped(BaseException):
    """Raised where a thread waits once its simulation has ended, to unwind it."""


class _Thread:
    """A simulated thread: a real one that runs only while it holds its baton."""

    def __init__(self, sim: SimRuntime, name: str, index: int, owner: str) -> None:
        self.sim, self.name, self.index, self.owner = sim, name, index, owner
        # Held by the scheduler while the thread may not run: released to let it run,
        # acquired by the thread itself to wait (a raw lock: the fastest handoff there is).
        self.baton = threading.Lock()
        self.baton.acquire()
        self.runnable = True
        self.done = False
        self.frozen = False  # its process was killed: it never runs again
        self.deadline: float | None = None  # virtual time it waits until, if it does
        self.woken = False  # why it last stopped waiting: woken (True) or timed out
        self.waiting_on: Any = None


class SimRuntime:
    """The engine's runtime for a simulation: see the module docstring."""

    def __init__(self, seed: int, preempt: float = PREEMPT) -> None:
        self.seed = seed
        self.now = 0.0
        self._rng = random.Random(seed)
        self._preempt = preempt
        self._threads: list[_Thread] = []
        self._local = threading.local()
        self._stopping = False
        self._driver: _Thread | None = None
        self._max_time = float("inf")
        self.hang: str | None = None  # why the simulation hung, if it did
        self.errors: list[tuple[str, BaseException]] = []  # what threads raised, unhandled
        self._trace = hashlib.sha256()
        self.events = 0
        self._singletons: dict[tuple[str, str], Any] = {}
        self._stalled_at, self._stalled = 0.0, 0

    # ------------------------------------------------------------ running
    def run(self, main: Callable[[], Any], max_time: float) -> Any:
        """Run ``main`` as the simulation's first thread, in the calling thread; then stop
        the other threads. SimHang when the simulation hangs, or when its virtual clock
        passes ``max_time`` (a run that never ends)."""
        self._max_time = max_time
        driver = self._register("main", "world")
        self._driver = driver
        self._local.thread = driver
        try:
            return main()
        finally:
            self._stop_all()

    def note(self, *event: Any) -> None:
        """Record an event of the simulated system in the trace (what happened, not when:
        the time is recorded with each switch)."""
        self.events += 1
        self._trace.update(repr(event).encode())
        self._trace.update(b"\n")

    def trace_digest(self) -> str:
        return self._trace.hexdigest()

    # ---------------------------------------------------------- the runtime
    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH + self.now

    def sleep(self, seconds: float) -> None:
        self._wait(None, self.now + max(0.0, seconds))

    def start_thread(self, target: Callable[..., Any], name: str,
                     args: tuple[Any, ...] = (), owner: str | None = None) -> None:
        """A thread of the simulation, of ``owner``'s process (by default its creator's)."""
        if self._stopping:
            raise SimStopped()
        thread = self._register(name, owner or self.current().owner)
        self.note("start", name, thread.index, thread.owner)

        def body() -> None:
            thread.baton.acquire()
            self._local.thread = thread
            try:
                if not self._stopping:
                    target(*args)
            except SimStopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - a check reports it
                if not thread.frozen:  # what a killed process does unwinding is moot
                    self.errors.append((name, exc))
            finally:
                thread.done = True
                thread.runnable = False
                self._threads.remove(thread)
                self._switch(thread, finished=True)

        threading.Thread(target=body, name=f"sim-{name}", daemon=True).start()

    def lock(self) -> SimLock:
        return SimLock(self)

    def rlock(self) -> SimLock:
        return SimLock(self, reentrant=True)

    def condition(self, lock: Any = None) -> SimCondition:
        return SimCondition(self, lock)

    def event(self) -> SimEvent:
        return SimEvent(self)

    def random(self, seed: Any = None) -> random.Random:
        return random.Random(self._rng.getrandbits(64) if seed is None else seed)

    def token_hex(self, nbytes: int) -> str:
        return self._rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    def secret(self, label: str, nbytes: int) -> bytes:
        """Bytes of ``label`` alone, not of the scheduler's seed: a deterministic run's
        final weights depend on its settings only, and a private run's on its noise key
        too, so every simulation of a run (its plan with and without faults, restarts
        before its first checkpoint included) gives it the same key."""
        return hashlib.shake_256(f"simulated secret: {label}".encode()).digest(nbytes)

    def process_singleton(self, name: str, make: Callable[[], Any]) -> Any:
        """One ``name`` per simulated process (the current thread's owner)."""
        key = (self.current().owner, name)
        if key not in self._singletons:
            self._singletons[key] = make()
        return self._singletons[key]

    def kill(self, owner: str) -> int:
        """Kill ``owner``'s process: its threads never run again (a SIGKILL). Returns how
        many there were."""
        victims = [t for t in self._threads if t.owner == owner and not t.done]
        for thread in victims:
            thread.frozen, thread.runnable, thread.deadline = True, False, None
        self.note("kill", owner, len(victims))
        return len(victims)
    # ------------------------------------------------------------ scheduling
    def current(self) -> _Thread:
        thread = getattr(self._local, "thread", None)
        if thread is None:
            raise RuntimeError("a thread outside the simulation used its runtime")
        return thread

    def maybe_yield(self) -> None:
        """A point where the scheduler may let another runnable thread run first."""
        if self._stopping or self._rng.random() >= self._preempt:
            return
        thread = self.current()
        self._switch(thread)

    def _register(self, name: str, owner: str) -> _Thread:
        self._started = getattr(self, "_started", 0) + 1
        thread = _Thread(self, name, self._started, owner)
        self._threads.append(thread)
        return thread

    def _wait(self, on: Any, deadline: float | None) -> bool:
        """Stop the current thread until woken (True) or its deadline passes (False)."""
        if self._stopping:
            raise SimStopped()
        thread = self.current()
        thread.runnable, thread.deadline, thread.woken = False, deadline, False
        thread.waiting_on = on
        self._switch(thread)
        thread.waiting_on = None
        if self._stopping:
            if thread is self._driver and self.hang is not None:
                raise SimHang(self.hang)
            raise SimStopped()
        return thread.woken

    def _wake(self, thread: _Thread) -> None:
        if not thread.runnable and not thread.done and not thread.frozen:
            thread.runnable, thread.woken, thread.deadline = True, True, None

    def _switch(self, thread: _Thread, finished: bool = False) -> None:
        """Hand the baton to the next thread to run (maybe ``thread`` again) and, unless
        ``thread`` finished, wait until it comes back. While the simulation stops, a
        finished thread hands it back to the driver, which unwinds the threads in turn."""
        if self._stopping and finished:
            self._driver.baton.release()
            return
        chosen = self._next()
        if self._livelocked():
            chosen = self._hang(f"livelock: {self._stalled} switches without virtual time "
                                "passing")
        self.note("run", chosen.index, round(self.now, 9))
        if chosen is thread:
            return
        chosen.baton.release()
        if not finished:
            thread.baton.acquire()

    def _livelocked(self) -> bool:
        """Threads that switch on and on while virtual time stands still busy-wait (a wait
        of no time in a loop): on a real machine they burn a core until real time moves;
        here time never would. Such a run hangs, saying so."""
        if self.now != self._stalled_at:
            self._stalled_at, self._stalled = self.now, 0
            return False
        self._stalled += 1
        return self._stalled > MAX_SWITCHES_AT_ONE_TIME and not self._stopping

    def _next(self) -> _Thread:
        """The thread to run next: a runnable one, drawn; else the clock jumps to the
        earliest deadline; else the simulation hangs and the driver is told."""
        while True:
            runnable = [t for t in self._threads if t.runnable]
            if runnable:
                return runnable[self._rng.randrange(len(runnable))]
            deadlines = [t.deadline for t in self._threads
                         if not t.done and t.deadline is not None]
            if not deadlines:
                return self._hang("every thread waits and none has a deadline")
            soonest = min(deadlines)
            if soonest > self._max_time:
                return self._hang(f"virtual time would pass {self._max_time:g}s")
            self.now = max(self.now, soonest)
            for waiting in self._threads:
                if waiting.deadline is not None and waiting.deadline <= self.now:
                    waiting.runnable, waiting.deadline = True, None

    def _hang(self, why: str) -> _Thread:
        """Stop the simulation: the driver, woken, raises SimHang(why)."""
        waits = ", ".join(f"{t.name} on {type(t.waiting_on).__name__}"
                          for t in self._threads
                          if not t.done and not t.runnable and not t.frozen)
        self.hang = f"{why} (at {self.now:g}s; waiting: {waits})"
        self._stopping = True
        return self._driver

    def _stop_all(self) -> None:
        """Unwind every other thread, one at a time: each gets the baton, finds the
        simulation stopping where it waits (SimStopped), and hands the baton back."""
        self._stopping = True
        driver = self._driver
        for thread in list(self._threads):
            if thread is not driver and not thread.done:
                thread.baton.release()
                driver.baton.acquire()
        driver.done = True
        self._threads = []


class SimLock:
    """A lock of the simulation: taking it may let another thread run first; a thread
    that finds it held waits for its release."""

    def __init__(self, sim: SimRuntime, reentrant: bool = False) -> None:
        self._sim = sim
        self._reentrant = reentrant
        self._owner: _Thread | None = None
        self._count = 0
        self._waiters: list[_Thread] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        sim = self._sim
        me = sim.current()
        if self._owner is me and self._reentrant:
            self._count += 1
            return True
        sim.maybe_yield()
        deadline = None if timeout is None or timeout < 0 else sim.now + timeout
        while self._owner is not None:
            if not blocking:
                return False
            if self._owner is me:  # a thread would wait for itself forever
                raise RuntimeError("a simulated lock taken twice by its thread")
            self._waiters.append(me)
            woken = sim._wait(self, deadline)
            if me in self._waiters:
                self._waiters.remove(me)
            if not woken and self._owner is not None:
                return False
        self._owner, self._count = me, 1
        return True

    def release(self) -> None:
        if self._owner is not self._sim.current():
            if self._sim._stopping:  # a thread unwinding past a lock a frozen one holds
                return
            raise RuntimeError("a simulated lock released by a thread that does not hold it")
        self._count -= 1
        if self._count:
            return
        self._owner = None
        waiters, self._waiters = self._waiters, []
        for thread in waiters:
            self._sim._wake(thread)

    def locked(self) -> bool:
        return self._owner is not None

    def _release_all(self) -> int:
        """Release entirely (for a condition's wait); returns the count to restore."""
        count, self._count = self._count, 1
        self.release()
        return count

    def _take_again(self, count: int) -> None:
        self.acquire()
        self._count = count

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class SimCondition:
    """A condition variable of the simulation over a `SimLock` (a new one by default)."""

    def __init__(self, sim: SimRuntime, lock: SimLock | None = None) -> None:
        self._sim = sim
        self._lock = lock if lock is not None else SimLock(sim, reentrant=True)
        self._waiters: list[_Thread] = []

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def acquire(self, *args: Any) -> bool:
        return self._lock.acquire(*args)

    def release(self) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        sim = self._sim
        me = sim.current()
        count = self._lock._release_all()
        self._waiters.append(me)
        try:
            woken = sim._wait(self, None if timeout is None else sim.now + max(0.0, timeout))
        finally:
            if me in self._waiters:
                self._waiters.remove(me)
            if sim._stopping:  # unwinding, alone: hold it again without waiting
                self._lock._owner, self._lock._count = me, count
            else:
                self._lock._take_again(count)
        return woken

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        deadline = None if timeout is None else self._sim.now + timeout
        result = predicate()
        while not result:
            left = None if deadline is None else deadline - self._sim.now
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        for thread in self._waiters[:n]:
            self._waiters.remove(thread)
            self._sim._wake(thread)
        self._sim.maybe_yield()

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class SimEvent:
    """An event of the simulation."""

    def __init__(self, sim: SimRuntime) -> None:
        self._sim = sim
        self._flag = False
        self._waiters: list[_Thread] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, []
        for thread in waiters:
            self._sim._wake(thread)
        self._sim.maybe_yield()

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        sim = self._sim
        me = sim.current()
        self._waiters.append(me)
        try:
            sim._wait(self, None if timeout is None else sim.now + max(0.0, timeout))
        finally:
            if me in self._waiters:
                self._waiters.remove(me)
        return self._flag
