"""The assignment's test cases 1-4 through the real system, against its published times.

Each scenario starts 4 compute nodes (3 s load delay, as in the assignment), a
coordinator and the client, all as separate processes on 127.0.0.1, trains 5
rounds (epochs 15, H 20, eta 0.0001, --compat so the validation error can be
compared digit for digit), and records the wall time and where the time went.
Every scenario runs with backup attempts (the default) and without them
(--no-speculation), and case 3 also with the adaptive policy 3.

    python bench/assignment_cases.py [--repeats 3] [--cases 1,2,3,4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

TRAIN_ARGS = ["letters", "5", "15", "20", "0.0001", "--compat", "--json", "--quiet"]
ASSIGNMENT_SECONDS = {1: 120.769, 2: 329.160, 3: 155.695, 4: 126.902}
ASSIGNMENT_ERROR = 0.8054


@dataclass(frozen=True)
class Scenario:
    case: int
    loads: tuple[float, ...]
    policy: int
    speculation: bool

    @property
    def label(self) -> str:
        names = {1: "random", 2: "load balancing", 3: "adaptive"}
        spec = "backups" if self.speculation else "no backups"
        return f"case {self.case}: policy {self.policy} ({names[self.policy]}), {spec}"


def scenarios(cases: list[int]) -> list[Scenario]:
    base = {1: ((0.2,) * 4, 2), 2: ((0.8,) * 4, 2), 3: ((0.2, 0.4, 0.6, 0.8), 2),
            4: ((0.2,) * 4, 1)}
    found = []
    for case in cases:
        loads, policy = base[case]
        policies = [policy, 3] if case == 3 else [policy]
        for p in policies:
            for speculation in (False, True):
                found.append(Scenario(case, loads, p, speculation))
    return found


def run_once(scenario: Scenario, seed: int, workdir: Path) -> dict:
    nodes = [local_cluster.start_node(workdir, f"node{i}", load, "--load-delay", "3",
                                      "--seed", str(seed * 10 + i), "--log-level", "WARNING")
             for i, load in enumerate(scenario.loads)]
    coordinator = None
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        extra = ["--seed", str(seed), "--log-level", "WARNING"]
        if not scenario.speculation:
            extra.append("--no-speculation")
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, scenario.policy,
                                                      *extra)
        started = time.monotonic()
        done = local_cluster.run_client(["127.0.0.1", str(coordinator.port), *TRAIN_ARGS],
                                        workdir, timeout=900)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"{scenario.label} failed: {done.stderr}")
        return {"wall": wall, **summarise(json.loads(done.stdout))}
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def summarise(result: dict) -> dict:
    nodes = result["nodes"]
    total = {key: sum(n[key] for n in nodes) for key in
             ("accepted", "rejected", "delayed", "failed", "cancelled", "busy_seconds",
              "compute_seconds", "delay_seconds")}
    return {"error": result["validation_error"],
            "update_seconds": sum(h["update_seconds"] for h in result["history"]), **total}


def measure(scenario: Scenario, repeats: int, workdir: Path) -> dict:
    runs = [run_once(scenario, seed, workdir) for seed in range(1, repeats + 1)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    median["errors"] = sorted({round(r["error"], 4) for r in runs})
    return median


def table(results: list[tuple[Scenario, dict]]) -> str:
    rows = ["| scenario | wall s (median) | assignment s | speed-up | validation error | "
            "rejected | delayed | backups cancelled | compute s | delay waited s | "
            "RPC+queue s | update+eval s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for scenario, m in results:
        ref = ASSIGNMENT_SECONDS[scenario.case]
        rpc = m["busy_seconds"] - m["compute_seconds"] - m["delay_seconds"]
        rows.append(
            f"| {scenario.label} | {m['wall']:.2f} | {ref:.0f} | {ref / m['wall']:.1f}x | "
            f"{', '.join(f'{e:.4f}' for e in m['errors'])} | {m['rejected']:.0f} | "
            f"{m['delayed']:.0f} | {m['cancelled']:.0f} | {m['compute_seconds']:.2f} | "
            f"{m['delay_seconds']:.1f} | {rpc:.2f} | {m['update_seconds']:.3f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per scenario (median)")
    parser.add_argument("--cases", default="1,2,3,4", help="comma-separated case numbers")
    parser.add_argument("--json", default=None, help="also write the medians to this file")
    args = parser.parse_args(argv)
    cases = [int(c) for c in args.cases.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-cases-") as tmp:
        for scenario in scenarios(cases):
            m = measure(scenario, args.repeats, Path(tmp))
            print(f"{scenario.label}: {m['wall']:.2f}s, error {m['errors']}", file=sys.stderr,
                  flush=True)
            results.append((scenario, m))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"scenario": s.label, **m} for s, m in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
