"""Run a Python script under cProfile in every thread and write the merged profile, in
pstats' format, when it exits: `bench/soak.py` runs the coordinator so when SOAK_PROFILE
names a file. Each thread gets a profiler of its own (cProfile sees one thread), kept
until the end and merged then, so the run pays no merging.

    python bench/profiled.py OUT.pstat SCRIPT [ARGS...]
    python -c "import pstats; pstats.Stats('OUT.pstat').sort_stats('tottime').print_stats(30)"
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import sys
import threading
import time
from pathlib import Path

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _profiled_run(run):  # noqa: ANN001, ANN202 - wraps Thread.run
    def run_profiled(self):  # noqa: ANN001, ANN202
        profile = cProfile.Profile(time.thread_time)  # CPU time of this thread
        with _lock:
            _profiles.append(profile)
        profile.runcall(run, self)
    return run_profiled


def main() -> None:
    out, script = sys.argv[1], sys.argv[2]
    sys.argv = sys.argv[2:]  # the script sees its own arguments and imports from its folder
    sys.path[0] = str(Path(script).resolve().parent)
    threading.Thread.run = _profiled_run(threading.Thread.run)
    main_profile = cProfile.Profile(time.thread_time)
    try:
        main_profile.runcall(runpy.run_path, script, run_name="__main__")
    finally:
        with _lock:
            profiles = [p for p in _profiles if p.getstats()]
        stats = pstats.Stats(main_profile)
        for profile in profiles:
            stats.add(profile)
        stats.dump_stats(out)
        print(f"profiled: {len(profiles) + 1} threads, written to {out}", file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    main()
