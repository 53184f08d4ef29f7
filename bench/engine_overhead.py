"""The round engine's own cost per unit: rounds of units whose nodes answer at once.

The nodes are in process and do no maths (each answers its unit with a tiny update), so
what is timed is the engine: its worker threads, queue, locks and waits, policy, attempt
log and update filters. `--repo` imports the engine from another checkout (the commit
before a change, say), and the two trees take turns, run after run, in fresh processes, so
a ratio compares them on the same machine at the same time:

    python bench/engine_overhead.py                          # this tree alone, about 10 s
    python bench/engine_overhead.py --repo /tmp/earlier-checkout --runs 5

Each run prints units per second (the median of `--reps` timed batches of `--rounds`
rounds of `--units` units over `--nodes` nodes); the last line is the ratio of the
medians over the runs, this tree over the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, help="another checkout to compare with")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree (3)")
    parser.add_argument("--nodes", type=int, default=4, help="in-process nodes (4)")
    parser.add_argument("--units", type=int, default=64, help="units a round (64)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds a batch (20)")
    parser.add_argument("--reps", type=int, default=5, help="timed batches a run (5)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # a child run
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> float:
    """Units per second through the engine of the tree on sys.path (a child process)."""
    from thrift_trainer.engine.nodes.pool import NodeHandle
    from thrift_trainer.engine.policies import RoundRobinPolicy
    from thrift_trainer.engine.progress import RunProgress
    from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine
    from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
    from thrift_trainer.training.units import UnitSpec

    update = {"w": np.zeros(4, dtype=np.float32)}

    class Instant:
        """A node client that answers every unit at once (engine.nodes.client)."""

        accepts_connections = True
        address = None

        def __init__(self) -> None:
            from thrift_trainer.wire.stats import PayloadBytes
            self.payload = PayloadBytes()

        def train(self, task: Task) -> TaskResult:
            return TaskResult(status=TaskStatus.COMPLETED, update=update, num_samples=1,
                              model_version=task.version)

        def abort(self, key, reason) -> bool:
            return False

        def cancel(self, *args) -> None:
            return None

        def close(self) -> None:
            return None

        def forget_connections(self) -> None:
            return None

    nodes = [NodeHandle(i, f"n{i}", Instant()) for i in range(args.nodes)]
    progress = RunProgress("r1", args.rounds, args.units, lambda: [])
    engine = RoundEngine("r1", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                         progress, threading.Event())
    specs = [UnitSpec(f"u{i}", f"u{i}") for i in range(args.units)]

    def build(unit: UnitSpec, attempt: int) -> Task:
        return Task(run_id="r1", round=1, unit_id=unit.unit_id, attempt=attempt,
                    algorithm="delta_avg", model="mlp", dataset="letters",
                    unit_path=unit.unit_path, config_json="{}", weights=update,
                    scheduling_policy=2)

    rates = []
    for _ in range(args.reps + 1):  # the first batch warms up
        began = time.perf_counter()
        for round_index in range(1, args.rounds + 1):
            outcome = engine.run_round(round_index, specs, len(specs), build)
            assert len(outcome.results) == len(specs)
        rates.append(args.rounds * args.units / (time.perf_counter() - began))
    return statistics.median(rates[1:])


def child(tree: Path, args: argparse.Namespace) -> float:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(tree),
               "--nodes", str(args.nodes), "--units", str(args.units),
               "--rounds", str(args.rounds), "--reps", str(args.reps)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["units_per_second"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure is not None:
        sys.path.insert(0, str(args.measure))
        print(json.dumps({"units_per_second": measure(args)}))
        return 0
    trees = {"this tree": REPO} | ({"other tree": args.repo.resolve()} if args.repo else {})
    rates: dict[str, list[float]] = {name: [] for name in trees}
    for run in range(1, args.runs + 1):
        for name, tree in trees.items():
            rates[name].append(child(tree, args))
            print(f"run {run}: {name:10s} {rates[name][-1]:9,.0f} units/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"median {name:10s} {value:9,.0f} units/s ({trees[name]})")
    if args.repo:
        print(f"ratio this/other {medians['this tree'] / medians['other tree']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
