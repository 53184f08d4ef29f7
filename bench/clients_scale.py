"""What many federated clients cost: 100, 1,000 and 10,000 partitioned clients.

The letters training part dealt IID to C clients (``clients.partition=iid``), 100 of them
asked per round, the ``mlp_classifier`` (hidden 64) trained by FedAvg (one local epoch of
SGD, batches of 8); 2 compute nodes, the first holding clients 0..C/2-1 (``--clients``),
the second the rest, and a coordinator, all on 127.0.0.1 and started afresh for each C
(so that each process's peak memory is that run's). For each C:

* the coordinator's CPU seconds (utime + stime from /proc/<pid>/stat) per client unit,
  over the rounds after the first (read when round 1's metrics row appears and after the
  client has ended), and over the whole run (from the client's start: the run check and
  the partition included);
* round overhead: the wall seconds of a round (the median of the rounds after the first,
  from metrics.jsonl), its phases, and the nodes' compute seconds per unit;
* every process's peak resident memory: VmHWM of the coordinator and of each node
  (/proc/<pid>/status, after the run) and the client's (its rusage), each against C = 100.

Every child runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/clients_scale.py              # about 5 minutes on 2 cores
    python bench/clients_scale.py --quick      # 100 and 1,000 clients, 2 rounds of 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.federated_cluster import FederatedCluster, memory_kib  # noqa: E402
from devtools.machine import describe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "clients_scale.json"
COUNTS = (100, 1000, 10000)
QUICK_COUNTS = (100, 1000)
PER_ROUND, NODES = 100, 2


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < NODES or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"--counts: distinct client counts of at least "
                                         f"{NODES}, e.g. 100,1000 (got {text!r})")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a check of the bench: 100 and 1,000 clients, 20 a round, 2 "
                        "rounds; results not written unless --out")
    parser.add_argument("--counts", type=parse_counts, default=None,
                        help="client counts, the first the baseline (default 100,1000,10000)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of each run (default 10; --quick 2)")
    parser.add_argument("--per-round", type=int, default=None,
                        help=f"clients asked per round (default {PER_ROUND}; --quick 20)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results JSON (default {RESULTS.relative_to(REPO)}; "
                        "--quick: none)")
    args = parser.parse_args(argv)
    args.counts = args.counts or list(QUICK_COUNTS if args.quick else COUNTS)
    args.rounds = args.rounds if args.rounds is not None else (2 if args.quick else 10)
    args.per_round = args.per_round if args.per_round is not None else \
        (20 if args.quick else PER_ROUND)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is left out of the figures)")
    if args.per_round < 1 or args.per_round > min(args.counts):
        parser.error("--per-round must lie between 1 and the smallest count")
    if args.out is None and not args.quick:
        args.out = RESULTS
    return args


def client_sets(count: int, per_round: int, rounds: int) -> list[str]:
    return ["run.algorithm=delta_avg", "run.model=mlp_classifier", "run.dataset=letters",
            "data.format=letters", "run.seed=1", f"run.rounds={rounds}",
            "outputs.checkpoint_every=0", f"clients.count={count}", "clients.partition=iid",
            f"clients.per_round={per_round}", "delta_avg.epochs=1",
            "delta_avg.local_optimizer=sgd", "delta_avg.batch_size=8", "delta_avg.eta=0.05"]


def measure(count: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with FederatedCluster(workdir, count, nodes=NODES) as cluster:
        idle = {name: memory_kib(proc.popen.pid) for name, proc in cluster.processes.items()}
        run = cluster.follow(client_sets(count, args.per_round, args.rounds), timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"{count} clients: the client ended with {run.returncode}: "
                               f"{run.stderr}\n{cluster.logs()[-6000:]}")
        peak = {name: memory_kib(proc.popen.pid) for name, proc in cluster.processes.items()}
        result = json.loads(run.stdout)
    rows = run.rows
    later = [row for row in rows if row["round"] >= 2]
    units_later = sum(row["clients_trained"] for row in later)
    units_all = sum(row["clients_trained"] for row in rows)
    phases = sorted({phase for row in later for phase in row.get("phase_seconds", {})})
    compute = sum(node["compute_seconds"] for node in result["nodes"])
    sizes = json.loads((run.run_dir / "partition.json").read_text())["sizes"]
    return {
        "clients": count, "rounds": len(rows), "units": units_all,
        "examples_per_client": [min(sizes), max(sizes)],
        "coordinator_cpu_per_unit_ms": 1000 * (run.cpu["end"] - run.cpu["round1"])
        / units_later,
        "coordinator_cpu_per_unit_ms_whole_run": 1000 * (run.cpu["end"] - run.cpu["start"])
        / units_all,
        "coordinator_cpu_seconds_to_round1": run.cpu["round1"] - run.cpu["start"],
        "seconds_to_round1": run.times["round1"] - run.times["start"],
        "round_seconds_median": statistics.median(row["seconds"] for row in later),
        "round_seconds": [round(row["seconds"], 4) for row in rows],
        "phase_seconds_median": {phase: statistics.median(
            row["phase_seconds"].get(phase, 0.0) for row in later) for phase in phases},
        "node_compute_ms_per_unit": 1000 * compute / units_all,
        # the round's wall time less the nodes' compute of its units, shared by the nodes
        "round_overhead_seconds": statistics.median(row["seconds"] for row in later)
        - compute / units_all * args.per_round / NODES,
        "units_per_node": [node["accepted"] for node in result["nodes"]],
        "peak_kib": peak | {"client": run.client_peak_kib}, "idle_peak_kib": idle,
        "validation_error": result["validation_error"], "run_id": result["run_id"]}


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    base = rows[0]
    names = list(base["peak_kib"])
    lines = [f"{args.per_round} clients a round, {args.rounds} rounds, {NODES} nodes each "
             "holding half; figures over the rounds after the first", "",
             "| clients | examples per client | coordinator CPU ms per unit | (whole run) | "
             "seconds to round 1 | round wall s (median) | node compute ms per unit | "
             "round wall s less compute | aggregate s | plan s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        low, high = row["examples_per_client"]
        phases = row["phase_seconds_median"]
        lines.append(f"| {row['clients']:,} | {low}-{high} | "
                     f"{row['coordinator_cpu_per_unit_ms']:.2f} | "
                     f"{row['coordinator_cpu_per_unit_ms_whole_run']:.2f} | "
                     f"{row['seconds_to_round1']:.1f} | {row['round_seconds_median']:.3f} | "
                     f"{row['node_compute_ms_per_unit']:.1f} | "
                     f"{row['round_overhead_seconds']:.3f} | "
                     f"{phases.get('aggregate', 0.0):.4f} | {phases.get('plan', 0.0):.4f} |")
    lines += ["", "Peak resident memory (VmHWM, MiB; x: against "
              f"{base['clients']:,} clients)", "",
              "| clients | " + " | ".join(names) + " |",
              "| ---: | " + " | ".join("---:" for _ in names) + " |"]
    for row in rows:
        cells = [f"{row['peak_kib'][n] / 1024:.1f} "
                 f"({row['peak_kib'][n] / base['peak_kib'][n]:.2f}x)" for n in names]
        lines.append(f"| {row['clients']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # only for its version, after the arguments are checked

    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-clients-scale-") as tmp:
        for count in args.counts:
            row = measure(count, args, Path(tmp) / f"c{count}")
            print(f"{count} clients: {row['coordinator_cpu_per_unit_ms']:.2f} ms CPU per "
                  f"unit, round {row['round_seconds_median']:.3f} s, peak "
                  f"{row['peak_kib']}", file=sys.stderr, flush=True)
            rows.append(row)
    load_after = os.getloadavg()
    print(report(rows, args))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {key: value for key, value in vars(args).items() if key != "out"}
        args.out.write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": load_after, "settings": settings,
             "client_sets": client_sets(args.counts[0], args.per_round, args.rounds),
             "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
