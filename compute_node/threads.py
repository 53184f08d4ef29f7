"""How many threads a node's maths may use, set before numpy or torch is imported.

Why: BLAS (under numpy) and torch start one thread per core by default, so several
nodes on one machine, or a node beside other work, oversubscribe the cores and run
slower than with one thread each. A node computes one unit at a time, so it uses one
thread unless `--threads N` says otherwise; OMP_NUM_THREADS set in the environment is
kept when --threads is not given. BLAS and torch read these variables once, when they
load, so compute_node.py applies them before importing anything else.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
DEFAULT_THREADS = 1


def threads_from_argv(argv: Sequence[str]) -> int | None:
    """The value of --threads in argv, or None when absent or not a positive integer
    (argparse reports a bad value later, with the usage)."""
    for i, token in enumerate(argv):
        if token == "--":
            break
        if token == "--threads" and i + 1 < len(argv):
            text = argv[i + 1]
        elif token.startswith("--threads="):
            text = token.partition("=")[2]
        else:
            continue
        return int(text) if text.isdigit() and int(text) > 0 else None
    return None


def limit_threads(threads: int | None,
                  environ: MutableMapping[str, str] = os.environ) -> int:
    """Set every thread variable to `threads`; without it, to OMP_NUM_THREADS when the
    environment sets it, else to one. Returns the count in force."""
    if threads is None:
        given = environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else DEFAULT_THREADS
    for name in THREAD_VARIABLES:
        environ[name] = str(threads)
    return threads
