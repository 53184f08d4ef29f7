"""Deterministic simulation: the real coordinator engine under seeded fault plans.

Each plan (devtools/simulation/plans.py) is drawn from a seed: the letters run's mode
(sync, async, buffered), its pushed and pull nodes, and up to six timed faults (nodes
crashing, hanging, slowing, rejecting, corrupting, losing or repeating replies, cut off,
leaving; the coordinator killed and resumed; its store failing). The real Run, engine,
ledger and SQLite store train it on a virtual clock in one process, one thread at a time
in an order the seed decides (devtools/simulation/world.py), then the checks run: the run
completes, the ledger audit holds, every ledger move is legal, sync runs end with the
fault-free run's weights, node counters agree with the store, and a private run's budget
in the store covers the releases it made (at every crash point too).

    python bench/simulate.py --seed 42              # replay one plan, bit for bit
    python bench/simulate.py --plan tests/simulation_plans/restarted-pull-node.json
    python bench/simulate.py --plans 1000 --jobs 2  # explore seeds 1..1000

A replay prints the plan (JSON), then `trace <hex>` and `weights <hex>`: digests of the
sequence of events and of the final weights, the same on every replay. Exploring ends with
`plans N failed F plans/hour P`; each failing plan is shrunk to a minimal plan that fails
the same way, printed and saved under --save (a test replays every plan saved there).
The script runs itself with PYTHONHASHSEED=0 and one BLAS thread, so that replays in
other processes and on other machines take the same steps.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What a replay's steps must not depend on: the order of sets of strings (the hash seed)
# and how BLAS splits its sums (threads, kernels).
PINNED_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
if platform.machine() in ("x86_64", "AMD64"):
    PINNED_ENV["OPENBLAS_CORETYPE"] = "Haswell"  # one kernel on every x86 CPU with AVX2


def _pin_environment() -> None:
    """Run again with the pinned environment, unless this process already has it."""
    if all(os.environ.get(k) == v for k, v in PINNED_ENV.items()):
        return
    env = {**os.environ, **PINNED_ENV}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    _pin_environment()

sys.path.insert(0, str(REPO))

from devtools.simulation.plans import Plan  # noqa: E402
from devtools.simulation.shrink import problem_kind, shrink  # noqa: E402
from devtools.simulation.world import Outcome, simulate  # noqa: E402

DEFAULT_SAVE = REPO / "tests" / "simulation_plans"
PROGRESS_EVERY = 100  # plans between progress lines while exploring


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 when every plan passed its checks, 1 otherwise.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--seed", type=int, help="replay the plan of this seed")
    what.add_argument("--plan", type=Path, help="replay a plan saved as JSON")
    what.add_argument("--plans", type=_positive, metavar="N",
                      help="explore N seeds (from --start), shrinking each failing plan")
    parser.add_argument("--start", type=int, default=1, help="first seed to explore (1)")
    parser.add_argument("--jobs", type=_positive, default=1,
                        help="processes exploring at once (1; at most one per core helps)")
    parser.add_argument("--save", type=Path, default=DEFAULT_SAVE,
                        help=f"where shrunk failing plans go ({DEFAULT_SAVE.relative_to(REPO)})")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report failing plans as drawn, without shrinking them")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# ------------------------------------------------------------------- replay
def replay(plan: Plan) -> Outcome:
    """Run one plan and print it, its digests and what its checks found."""
    print(plan.to_json(), flush=True)
    outcome = simulate(plan)
    print(f"trace {outcome.trace}")
    print(f"weights {outcome.weights or '-'}")
    print(f"{outcome.state} after {outcome.virtual_seconds:.1f} virtual seconds, "
          f"{outcome.events} events, {outcome.incarnations} coordinator process(es)"
          + (f": {outcome.reason}" if outcome.state != "completed" else ""))
    for problem in outcome.problems:
        print(f"FAILED: {problem}")
    return outcome


def load_plan(path: Path) -> Plan:
    try:
        return Plan.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"cannot read the plan {path}: {exc}") from None


# ------------------------------------------------------------------ explore
def _run_seed(seed: int) -> tuple[int, list[str]]:
    """One explored plan's problems (a worker's task)."""
    logging.disable(logging.CRITICAL)  # the engine's warnings are the faults', by design
    outcome = simulate(Plan.from_seed(seed))
    return seed, outcome.problems


def explore(first: int, count: int, jobs: int) -> tuple[dict[int, list[str]], float]:
    """Run seeds ``first``.. ``first+count-1``; their problems by failing seed, and the
    plans per hour."""
    seeds = range(first, first + count)
    failures: dict[int, list[str]] = {}
    began = time.monotonic()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for done, (seed, problems) in enumerate(pool.imap_unordered(_run_seed, seeds), 1):
            if problems:
                failures[seed] = problems
                print(f"FAIL {Plan.from_seed(seed)}: {problems[0]}", flush=True)
            if done % PROGRESS_EVERY == 0 and done < count:
                rate = done / (time.monotonic() - began) * 3600
                print(f"... {done}/{count} plans, {len(failures)} failed, "
                      f"{rate:,.0f} plans/hour", file=sys.stderr, flush=True)
    return failures, count / (time.monotonic() - began) * 3600


def verdict(plan: Plan) -> str | None:
    """The kind of a plan's first problem; None when it passes."""
    problems = simulate(plan).problems
    return problem_kind(problems[0]) if problems else None


def save_shrunk(seed: int, problems: list[str], save: Path) -> Path:
    """Shrink a failing seed's plan, print it and save it as a regression plan."""
    logging.disable(logging.CRITICAL)
    smaller, tries = shrink(Plan.from_seed(seed), verdict)
    save.mkdir(parents=True, exist_ok=True)
    path = save / f"seed-{seed}.json"
    path.write_text(smaller.to_json(found=problems[0]) + "\n")
    print(f"seed {seed} shrunk in {tries} plans to: {smaller}\n  saved as {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seed is not None or args.plan is not None:
        plan = Plan.from_seed(args.seed) if args.plan is None else load_plan(args.plan)
        logging.disable(logging.CRITICAL)
        return 1 if replay(plan).failed else 0
    failures, rate = explore(args.start, args.plans, args.jobs)
    if not args.no_shrink:
        for seed, problems in sorted(failures.items()):
            save_shrunk(seed, problems, args.save)
    print(f"plans {args.plans} failed {len(failures)} plans/hour {rate:.0f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
