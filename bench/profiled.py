"""Run a Python script (the coordinator, from bench/soak.py) and say where its CPU went.

Two ways, both over every thread of the process:

* ``--timers``: the thread CPU time and context switches (getrusage) spent inside each
  of the engine's and the store's main functions (TIMED below; a nested call of the same
  function counts once), and in every thread by kind (``thread <name with its numbers as
  N>``: the engine's cached threads per target, others whole; threads still running at
  exit from /proc), with the process's own CPU time and switches, written as a table
  when the script exits. The timers cost about a microsecond a call, so the figures are
  the real ones.
* otherwise cProfile, one profiler per thread, merged into one pstats file at exit. Its
  per-call overhead inflates Python-heavy code several times (CPU per unit comes out
  4-8 times the real one), so it says which functions are called how often, not how much
  of the CPU each takes. Blocking waits show up as `acquire` time: ignore that line.

    python bench/profiled.py [--timers] OUT SCRIPT [ARGS...]
    python -c "import pstats; pstats.Stats('OUT').sort_stats('tottime').print_stats(30)"
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import os
import pstats
import re
import resource
import runpy
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module, class or None, function): what --timers measures
TIMED = [
    ("thrift_trainer.engine.round_engine", "RoundEngine", "_worker"),
    ("thrift_trainer.engine.round_engine", "RoundEngine", "_try_nodes"),
    ("thrift_trainer.engine.round_engine", "RoundEngine", "_order"),
    ("thrift_trainer.engine.round_engine", "RoundEngine", "_answered"),
    ("thrift_trainer.engine.round_engine", "RoundEngine", "_wait"),
    ("thrift_trainer.engine.round_engine", None, "run_filters"),
    ("thrift_trainer.engine.work_queue", "WorkQueue", "next_unit"),
    ("thrift_trainer.engine.nodes.thrift_client", "ThriftNodeClient", "train"),
    ("thrift_trainer.engine.nodes.thrift_client", "ThriftNodeClient", "_train_call"),
    ("thrift_trainer.engine.nodes.pool", "NodeHandle", "heartbeat"),
    ("thrift_trainer.engine.attempt_log", "AttemptLog", "started"),
    ("thrift_trainer.engine.attempt_log", "AttemptLog", "answered"),
    ("thrift_trainer.engine.attempt_log", "AttemptLog", "ended"),
    ("thrift_trainer.coordinator.sqlite_writes", "SqliteWrites", "_apply"),
    ("thrift_trainer.coordinator.handler", "CoordinatorHandler", "status"),
    ("thrift_trainer.coordinator.training_loop", "TrainingLoop", "_round"),
    ("thrift_trainer.coordinator.training_loop", "TrainingLoop", "_write_round"),
    ("thrift_trainer.coordinator.training_loop", "TrainingLoop", "_aggregate"),
    ("thrift_trainer.coordinator.training_loop", "TrainingLoop", "_evaluate"),
    ("thrift_trainer.engine.round_engine", "RoundEngine", "run_round"),
    ("thrift_trainer.engine.ledger", "UnitLedger", "plan_units"),
    ("thrift_trainer.engine.ledger", "UnitLedger", "round_ended"),
    ("thrift_trainer.coordinator.run_folder", "RunFolder", "write_checkpoint"),
    ("thrift_trainer.coordinator.run_folder", "RunFolder", "append_round"),
    ("thrift_trainer.coordinator.run_folder", "RunFolder", "write_samples"),
    ("thrift_trainer.coordinator.write_behind", "WriteBehind", "flush"),
    ("thrift_trainer.wire.stats", "WireStats", "record"),
    ("thrift_trainer.engine.nodes.thrift_client", None, "work_request"),
    ("thrift_trainer.engine.nodes.thrift_client", None, "task_result"),
]


def _thread_usage() -> tuple[float, int]:
    """This thread's CPU seconds and context switches (voluntary and involuntary) so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


class Timers:
    """Thread CPU seconds, context switches and calls per timed function."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._depth = threading.local()

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, name, 0)
            setattr(self._depth, name, depth + 1)
            started = _thread_usage()
            try:
                return function(*args, **kwargs)
            finally:
                setattr(self._depth, name, depth)
                if depth == 0:  # a recursive call counts once
                    self.add(name, started)
        return timed

    def add(self, name: str, started: tuple[float, int]) -> None:
        """One call of ``name`` that began at ``started`` (_thread_usage) ends now."""
        seconds, switches = _thread_usage()
        with self._lock:
            total = self.totals.setdefault(name, [0, 0.0, 0])
            total[0] += 1
            total[1] += seconds - started[0]
            total[2] += switches - started[1]

    def install_threads(self) -> None:
        """Also time every thread's whole run, by kind (its name with digits as N): the
        engine's threads per target (runtime's cached threads run many), others whole."""
        from thrift_trainer.engine import runtime

        def start_thread(system: Any, target: Callable[..., Any], name: str,
                         args: tuple[Any, ...] = ()) -> None:
            def timed_target(*targs: Any) -> None:
                started = _thread_usage()
                try:
                    target(*targs)
                finally:
                    self.add(f"thread {_kind(name)}", started)
            start(system, timed_target, name, args)

        start = runtime.SystemRuntime.start_thread
        runtime.SystemRuntime.start_thread = start_thread  # type: ignore[method-assign]
        plain_run = threading.Thread.run

        def run(thread: threading.Thread) -> None:
            if _is_cached(thread):  # timed per target
                plain_run(thread)
                return
            started = _thread_usage()
            try:
                plain_run(thread)
            finally:
                self.add(f"thread {_kind(thread.name)}", started)

        threading.Thread.run = run  # type: ignore[method-assign]

    def install_gc(self) -> None:
        """Also time the cyclic garbage collector's passes, by generation."""
        started: dict[int, tuple[float, int]] = {}

        def on_gc(phase: str, info: dict[str, int]) -> None:
            key = threading.get_ident()
            if phase == "start":
                started[key] = _thread_usage()
            elif key in started:
                self.add(f"gc generation {info['generation']}", started.pop(key))

        gc.callbacks.append(on_gc)

    def install(self) -> None:
        for module_name, owner_name, function_name in TIMED:
            try:  # a version of the code without one of them (an older commit) is timed
                module = importlib.import_module(module_name)  # without it
                owner = getattr(module, owner_name) if owner_name else module
                getattr(owner, function_name)
            except (ImportError, AttributeError):
                continue
            name = f"{owner_name}.{function_name}" if owner_name else function_name
            setattr(owner, function_name, self.wrap(name, getattr(owner, function_name)))

    def add_live_threads(self) -> None:
        """Threads still running at exit (the store's writer, servers' threads), whole:
        their CPU and switches so far, from /proc (the engine's cached threads all told,
        their targets' share included)."""
        tick = os.sysconf("SC_CLK_TCK")
        for thread in threading.enumerate():
            kind = ("cached threads, targets included" if _is_cached(thread)
                    else _kind(thread.name))
            task = Path(f"/proc/self/task/{thread.native_id}")
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(line.split(":", 1) for line in
                              (task / "status").read_text().splitlines() if ":" in line)
            except (OSError, ValueError):
                continue  # ended meanwhile
            seconds = (int(fields[11]) + int(fields[12])) / tick
            switches = sum(int(status[k]) for k in ("voluntary_ctxt_switches",
                                                     "nonvoluntary_ctxt_switches"))
            with self._lock:
                total = self.totals.setdefault(f"live thread {kind}", [0, 0.0, 0])
                total[0] += 1
                total[1] += seconds
                total[2] += switches

    def write(self, out: str) -> None:
        self.add_live_threads()
        times = os.times()
        switches = resource.getrusage(resource.RUSAGE_SELF)
        lines = [f"process CPU {times.user + times.system:.2f} s (user {times.user:.2f}, "
                 f"system {times.system:.2f}); context switches {switches.ru_nvcsw:,} "
                 f"voluntary, {switches.ru_nivcsw:,} involuntary",
                 "function | calls | CPU s | us per call | context switches"]
        for name, (calls, seconds, moves) in sorted(self.totals.items(),
                                                    key=lambda x: -x[1][1]):
            lines.append(f"{name} | {int(calls)} | {seconds:.3f} | "
                         f"{1e6 * seconds / max(calls, 1):.1f} | {int(moves):,}")
        Path(out).write_text("\n".join(lines) + "\n")


def _is_cached(thread: threading.Thread) -> bool:
    """Whether ``thread`` is one of the engine's cached threads (timed per target)."""
    from thrift_trainer.engine import runtime
    target = getattr(thread, "_target", None)
    return getattr(target, "__func__", None) is runtime._CachedThread.run


def _kind(name: str) -> str:
    """A thread's name without its numbers: threads of one kind add up."""
    return re.sub(r"\d+", "N", name)


_profiles: list[cProfile.Profile] = []
_profiles_lock = threading.Lock()


def _profiled_run(run: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
    def run_profiled(thread: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)  # this thread's CPU time
        with _profiles_lock:
            _profiles.append(profile)
        profile.runcall(run, thread)
    return run_profiled


def _write_profile(out: str, main_profile: cProfile.Profile) -> None:
    with _profiles_lock:
        profiles = [p for p in _profiles if p.getstats()]
    stats = pstats.Stats(main_profile)
    for profile in profiles:
        stats.add(profile)
    stats.dump_stats(out)


def main() -> None:
    timers = sys.argv[1] == "--timers"
    args = sys.argv[2:] if timers else sys.argv[1:]
    out, script = args[0], args[1]
    sys.argv = args[1:]  # the script sees its own arguments and imports from its folder
    sys.path[0] = str(Path(script).resolve().parent)
    if timers:
        import thrift_trainer  # noqa: F401 - the script's packages, importable from here

        measured = Timers()
        measured.install()
        measured.install_threads()
        measured.install_gc()
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            measured.write(out)
        return
    threading.Thread.run = _profiled_run(threading.Thread.run)  # type: ignore[method-assign]
    main_profile = cProfile.Profile(time.thread_time)
    try:
        main_profile.runcall(runpy.run_path, script, run_name="__main__")
    finally:
        _write_profile(out, main_profile)


if __name__ == "__main__":
    main()
