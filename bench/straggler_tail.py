"""What a K-of-N round pays for the unit it no longer needs: the round engine alone.

A round that keeps the first K of N results (sync SGD's partial synchronisation) should
end when its K-th result is in, however long the N-th unit still runs. This runs the
round engine (engine/round_engine.py) over in-process nodes (tests/inprocess.py: the
real node handler, no sockets) whose calls take a fixed time that a cancel cannot cut
short, as a unit of one micro-batch on a slower machine: ``--fast-ms`` on the fast nodes,
``--straggler-ms`` on the straggler. Both cases in one run, rounds alternating:

* **baseline**: K fast nodes, K of K units;
* **straggler**: the same K fast nodes and one straggler, K of K + 1 units.

Each round's wall time (median over ``--rounds``) and their ratio; ideal: 1.0.

    python bench/straggler_tail.py [--rounds 40] [--fast-ms 20] [--straggler-ms 200] [--k 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.machine import describe  # noqa: E402
from tests.inprocess import LocalNode  # noqa: E402
from thrift_trainer.engine.policies import RoundRobinPolicy  # noqa: E402
from thrift_trainer.engine.progress import RunProgress  # noqa: E402
from thrift_trainer.engine.round_engine import EngineSettings, RoundEngine  # noqa: E402
from thrift_trainer.engine.tasks import Task, TaskResult  # noqa: E402
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.units import UnitSpec  # noqa: E402

ALGORITHM = DeltaAveraging("mlp", {"epochs": 1, "eta": 0.0001, "hidden": [8]},
                           DEFAULT_DATA_ROOT / "letters")
WEIGHTS = ALGORITHM.initial_weights()


class TimedNode(LocalNode):
    """A node whose every call takes ``seconds`` first, which no cancel cuts short."""

    def __init__(self, index: int, seconds: float) -> None:
        super().__init__(index)
        self.seconds = seconds

    def train(self, task: Task) -> TaskResult:
        time.sleep(self.seconds)
        return super().train(task)


def build(unit: UnitSpec, attempt: int) -> Task:
    return Task(run_id="tail", round=1, unit_id=unit.unit_id, attempt=attempt,
                algorithm="delta_avg", model="mlp", dataset="letters",
                unit_path=unit.unit_path, config_json=json.dumps(ALGORITHM.config),
                weights=WEIGHTS, scheduling_policy=2)


def make_engine(nodes: list[LocalNode]) -> RoundEngine:
    progress = RunProgress("tail", 1, len(nodes), lambda: [n.summary() for n in nodes])
    return RoundEngine("tail", nodes, RoundRobinPolicy(), EngineSettings(speculation=False),
                       progress, threading.Event())


def round_seconds(engine: RoundEngine, units: list[UnitSpec], quorum: int) -> float:
    began = time.monotonic()
    outcome = engine.run_round(1, units, quorum, build)
    assert len(outcome.results) == quorum
    return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of each case")
    parser.add_argument("--fast-ms", type=float, default=20.0, help="a fast node's call")
    parser.add_argument("--straggler-ms", type=float, default=200.0,
                        help="the straggler's call")
    parser.add_argument("--k", type=int, default=3, help="fast nodes = results kept")
    args = parser.parse_args(argv)
    fast = [TimedNode(i, args.fast_ms / 1000) for i in range(args.k)]
    straggler = TimedNode(args.k, args.straggler_ms / 1000)
    units = ALGORITHM.plan_round(1)[: args.k + 1]
    baseline, with_straggler = make_engine(fast), make_engine([*fast, straggler])
    times: dict[str, list[float]] = {"baseline": [], "straggler": []}
    for _ in range(args.rounds):
        times["baseline"].append(round_seconds(baseline, units[: args.k], args.k))
        times["straggler"].append(round_seconds(with_straggler, units, args.k))
    medians = {case: statistics.median(seconds) * 1000 for case, seconds in times.items()}
    print(f"{describe()}; {args.rounds} rounds each, fast calls {args.fast_ms:g} ms, "
          f"straggler {args.straggler_ms:g} ms\n")
    print("| case | round ms (median) |\n|---|---|")
    print(f"| baseline: {args.k} fast nodes, {args.k} of {args.k} | {medians['baseline']:.1f} |")
    print(f"| {args.k} fast nodes and a straggler, {args.k} of {args.k + 1} | "
          f"{medians['straggler']:.1f} |")
    print(f"\nstraggler / baseline: {medians['straggler'] / medians['baseline']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
