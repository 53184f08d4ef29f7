"""Time, randomness and concurrency as the engine sees them: through a runtime it is given.

Everything in `engine/` (and the coordinator's run loop) that reads a clock, sleeps, starts
a thread, waits on a lock, a condition or an event, or draws a random number does it
through this module, never through `time`, `threading` or `random` directly (a test reads
the sources and holds them to it). In production the runtime is `SystemRuntime`: the
functions below are the standard library's, at the cost of one indirection. A simulation
installs its own (`installed`): a virtual clock and a seeded scheduler that runs one
thread at a time, so that one seed gives one exact sequence of events (see
`devtools/simulation/`).

Use it like the standard library::

    from thrift_trainer.engine import runtime

    started = runtime.monotonic()
    done = runtime.Event()
    runtime.start_thread(work, "worker-1", args=(done,))
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class EventLike(Protocol):
    """What the engine uses of an event (`threading.Event`'s methods)."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class Runtime(Protocol):
    """What the engine may use of time, randomness and concurrency."""

    def monotonic(self) -> float: ...
    def wall(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    def start_thread(self, target: Callable[..., Any], name: str,
                     args: tuple[Any, ...] = ()) -> None: ...
    def lock(self) -> Any: ...
    def rlock(self) -> Any: ...
    def condition(self, lock: Any = None) -> Any: ...
    def event(self) -> Any: ...
    def random(self, seed: Any = None) -> random.Random: ...
    def token_hex(self, nbytes: int) -> str: ...
    def secret(self, label: str, nbytes: int) -> bytes: ...
    def process_singleton(self, name: str, make: Callable[[], Any]) -> Any: ...


class SystemRuntime:
    """The standard library's clocks, threads and locks: what runs in production."""

    def __init__(self) -> None:
        self._singletons: dict[str, Any] = {}
        self._singletons_lock = threading.Lock()

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start_thread(self, target: Callable[..., Any], name: str,
                     args: tuple[Any, ...] = ()) -> None:
        _THREADS.start(target, name, args)

    def lock(self) -> threading.Lock:
        return threading.Lock()

    def rlock(self) -> Any:
        return threading.RLock()

    def condition(self, lock: Any = None) -> threading.Condition:
        return threading.Condition(lock)

    def event(self) -> threading.Event:
        return threading.Event()

    def random(self, seed: Any = None) -> random.Random:
        return random.Random(seed)

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)

    def secret(self, label: str, nbytes: int) -> bytes:
        return secrets.token_bytes(nbytes)  # the label names it; each call is a new one

    def process_singleton(self, name: str, make: Callable[[], Any]) -> Any:
        with self._singletons_lock:
            if name not in self._singletons:
                self._singletons[name] = make()
            return self._singletons[name]


class _ThreadCache:
    """Daemon threads that, their target done, wait a while for the next one instead of
    ending: a round starts 2N + 2 workers, and making a thread costs the process several
    times the CPU of waking one (0.15 ms against a few hundredths)."""

    IDLE_SECONDS = 30.0  # an idle thread ends after this long
    MAX_IDLE = 512  # threads beyond these end instead of waiting

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_CachedThread] = []
        if hasattr(os, "register_at_fork"):  # a forked child has none of these threads
            os.register_at_fork(after_in_child=self._forget_threads)

    def _forget_threads(self) -> None:
        self._lock = threading.Lock()
        self._idle = []

    def start(self, target: Callable[..., Any], name: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            thread = self._idle.pop() if self._idle else None
        if thread is None:
            thread = _CachedThread(self)
            thread.give(target, name, args)
            threading.Thread(target=thread.run, name=name, daemon=True).start()
        else:
            thread.give(target, name, args)

    def park(self, thread: _CachedThread) -> bool:
        """Whether ``thread`` may wait for a target (else it ends)."""
        with self._lock:
            if len(self._idle) >= self.MAX_IDLE:
                return False
            self._idle.append(thread)
            return True

    def unpark(self, thread: _CachedThread) -> bool:
        """Whether an idle ``thread`` that waited long enough was still idle (it ends);
        False: a target was just handed to it."""
        with self._lock:
            if thread in self._idle:
                self._idle.remove(thread)
                return True
            return False


class _CachedThread:
    """One thread of the cache: runs the targets it is given, one at a time."""

    def __init__(self, cache: _ThreadCache) -> None:
        self._cache = cache
        self._given = threading.Lock()  # released when a target is given
        self._given.acquire()
        self._work: tuple[Callable[..., Any], str, tuple[Any, ...]] | None = None

    def give(self, target: Callable[..., Any], name: str, args: tuple[Any, ...]) -> None:
        self._work = (target, name, args)
        self._given.release()

    def run(self) -> None:
        while self._next():
            target, name, args = self._work
            self._work = None
            threading.current_thread().name = name
            try:
                target(*args)
            except SystemExit:  # as a thread of its own ends quietly on it
                pass
            except BaseException as exc:  # noqa: BLE001 - reported as a thread's would be
                threading.excepthook(threading.ExceptHookArgs(
                    (type(exc), exc, exc.__traceback__, threading.current_thread())))
            del target, args, name  # nothing of the finished target stays referenced
            if not self._cache.park(self):
                return

    def _next(self) -> bool:
        if self._given.acquire(timeout=self._cache.IDLE_SECONDS):
            return True
        if self._cache.unpark(self):
            return False
        self._given.acquire()  # handed a target as it gave up waiting: it is on its way
        return True


_THREADS = _ThreadCache()
SYSTEM = SystemRuntime()
_current: Runtime = SYSTEM


def current() -> Runtime:
    return _current


@contextlib.contextmanager
def installed(runtime: Runtime) -> Iterator[Runtime]:
    """Make ``runtime`` the engine's for the block (a simulation's), then the previous."""
    global _current
    previous, _current = _current, runtime
    try:
        yield runtime
    finally:
        _current = previous


# ------------------------------------------------------ the engine's vocabulary
def monotonic() -> float:
    """Seconds on a clock that only moves forward (the simulation's: virtual)."""
    return _current.monotonic()


def wall() -> float:
    """Seconds since the epoch, for records people read (the simulation's: virtual)."""
    return _current.wall()


def sleep(seconds: float) -> None:
    _current.sleep(seconds)


def start_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> None:
    """Run ``target(*args)`` in a daemon thread of the runtime."""
    _current.start_thread(target, name, args)


def Lock() -> Any:  # noqa: N802 - named as threading names it
    return _current.lock()


def RLock() -> Any:  # noqa: N802
    return _current.rlock()


def Condition(lock: Any = None) -> Any:  # noqa: N802
    return _current.condition(lock)


def Event() -> Any:  # noqa: N802
    return _current.event()


def Random(seed: Any = None) -> random.Random:  # noqa: N802
    """A generator of the runtime's: ``seed`` as given, or (None) one the runtime picks:
    the system's entropy in production, the simulation's seed in a simulation."""
    return _current.random(seed)


def token_hex(nbytes: int) -> str:
    """A secret of ``nbytes`` random bytes in hex (the simulation's: from its seed)."""
    return _current.token_hex(nbytes)


def secret(label: str, nbytes: int) -> bytes:
    """A new secret of ``nbytes`` bytes (a private run's noise key): the system's entropy
    in production; in a simulation, a function of ``label`` alone, so that one run holds
    the same secret in every simulation of it, with faults or without."""
    return _current.secret(label, nbytes)


def process_singleton(name: str, make: Callable[[], Any]) -> Any:
    """The process's one ``name``, made by ``make`` on first use (a simulation keeps one
    per simulated process)."""
    return _current.process_singleton(name, make)


class Task:
    """A call running in a thread of its own (`submit`)."""

    def __init__(self) -> None:
        self._done = Event()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


def submit(target: Callable[..., Any], *args: Any, name: str = "task") -> Task:
    """``target(*args)`` in a thread of its own, its exception dropped (a heartbeat's
    failure is its node's to record); the task says when it is done."""
    task = Task()

    def run() -> None:
        try:
            target(*args)
        except Exception:  # noqa: BLE001, S110 - the target records its own failures
            pass
        finally:
            task._done.set()

    start_thread(run, name)
    return task


def parallel_map(function: Callable[[Any], Any], items: list[Any], threads: int,
                 name: str) -> list[Any]:
    """``[function(item) for item in items]`` computed by up to ``threads`` threads of the
    runtime at once, in the items' order; the first exception raised is raised again."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    lock, finished = Lock(), Condition()
    state = {"next": 0, "running": min(threads, len(items))}

    def work() -> None:
        try:
            while True:
                with lock:
                    index = state["next"]
                    state["next"] += 1
                if index >= len(items):
                    return
                try:
                    results[index] = function(items[index])
                except Exception as exc:  # noqa: BLE001 - raised again by the caller
                    errors.append(exc)
        finally:
            with finished:
                state["running"] -= 1
                finished.notify_all()

    for i in range(state["running"]):
        start_thread(work, f"{name}-{i}")
    with finished:
        finished.wait_for(lambda: state["running"] == 0)
    if errors:
        raise errors[0]
    return results
