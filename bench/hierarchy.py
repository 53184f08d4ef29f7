"""DCGAN-28 sync_sgd on one node with local workers (`--workers W`) against DDP.

Paths, all on this machine, every process with one thread and ended by its PID:

(b) torch DistributedDataParallel, gloo, 2 processes x 1 thread, ``unit`` images each per
    step: bench/dcgan_throughput.py's baseline, run from there (not copied);
(w1) one compute node, ``--workers 1`` (today's node), K = N = 1: each round one unit of
     ``unit`` images;
(w2) one compute node, ``--workers 2``: each unit split between two worker processes
     (``unit`` / 2 images each) whose gradients are all-reduced inside the node;
(w2') the same node with units of 2 x ``unit`` images: DDP's global batch.

Images/s = images per update x updates / seconds: for DDP its timed steady state, for the
nodes the span between the coordinator's log lines of round 1 and round R (start-up and
round 1 excluded, every per-round cost included), as in bench/dcgan_throughput.py.

    python bench/hierarchy.py              # U = 320, B = 32, 3 passes; about 6 minutes
    python bench/hierarchy.py --letters    # letters through relays instead (see
                                           # bench/hierarchy_letters.py); about 6 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dcgan_throughput as baseline  # noqa: E402 - sets OMP_NUM_THREADS=1 before torch
import hierarchy_letters  # noqa: E402

from devtools import local_cluster  # noqa: E402

REPO = baseline.REPO


def run_node(workers: int, unit: int, batch: int, rounds: int,
             workdir: Path) -> baseline.PathResult:
    """One node with `workers` local workers, its coordinator and a client, K = N = 1."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs = [local_cluster.start_node(workdir, "node", 0.0, "--workers", str(workers))]
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", procs)
        procs.append(local_cluster.start_coordinator(workdir, nodes_file, 2, "--log-level",
                                                     "INFO", "--no-speculation"))
        sets = {"run.model": baseline.MODEL, "run.rounds": rounds,
                "sync_sgd.images_per_work_unit": unit, "sync_sgd.batch_size": batch,
                "sync_sgd.num_workunits_per_update": 1, "sync_sgd.units_per_iteration": 1,
                "outputs.eval_every": 0, "outputs.sample_every": 0,
                "outputs.checkpoint_every": 0}
        args = ["127.0.0.1", str(procs[-1].port), "--config", "configs/dcgan_mnist.yaml",
                *[a for key, value in sets.items() for a in ("--set", f"{key}={value}")],
                "--json", "--quiet", "--out", str(workdir / "models")]
        done = local_cluster.run_client(args, REPO, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"--workers {workers} run failed: {done.stderr}\n"
                               f"{procs[0].log()}\n{procs[-1].log()}")
    finally:
        for proc in reversed(procs):
            proc.stop()
    ends = baseline.round_times(procs[-1].log())
    result = json.loads(done.stdout)
    unit_seconds = [float(m.group(2)) for m in baseline.UNIT_LINE.finditer(procs[0].log())
                    if int(m.group(1)) > 1]
    return baseline.PathResult(f"one node, --workers {workers}, U = {unit}", workers, unit,
                               result["rounds"] - 1, ends[result["rounds"]] - ends[1],
                               {"unit_ms": 1000 * sum(unit_seconds) / len(unit_seconds)})


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def report(passes: list[dict[str, baseline.PathResult]], loads: list[dict[str, str]]) -> str:
    """One row per path and pass, with its ratio to the same pass's DDP; then medians."""
    lines = ["| pass | path | images per update | updates timed | seconds | ms per update | "
             "node's unit maths, ms | images/s | vs DDP (same pass) | load average before |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for number, (results, load) in enumerate(zip(passes, loads, strict=True), 1):
        ddp = results["ddp"].images_per_second
        for key, r in results.items():
            maths = f"{r.extra['unit_ms']:.0f}" if "unit_ms" in r.extra else "-"
            lines.append(f"| {number} | {r.label} | {r.global_batch} | {r.updates} | "
                         f"{r.seconds:.1f} | {1000 * r.seconds / r.updates:.0f} | {maths} | "
                         f"{r.images_per_second:,.0f} | {r.images_per_second / ddp:.2f}x | "
                         f"{load[key]} |")
    lines += ["", "| path | median images/s | median ratio to DDP |", "| --- | ---: | ---: |"]
    for key, first in passes[0].items():
        speeds = [p[key].images_per_second for p in passes]
        ratios = [p[key].images_per_second / p["ddp"].images_per_second for p in passes]
        lines.append(f"| {first.label} | {statistics.median(speeds):,.0f} | "
                     f"{statistics.median(ratios):.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit", type=int, default=320, help="images per unit (default 320)")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch (default 32)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per node run "
                        "(default 30; the first is not timed)")
    parser.add_argument("--ddp-seconds", type=float, default=15.0,
                        help="DDP's timed steady state (default 15)")
    parser.add_argument("--passes", type=int, default=3,
                        help="passes over every path, one after the other, so that a busy "
                             "spell of a shared machine shows (default 3)")
    parser.add_argument("--letters", action="store_true",
                        help="run the letters comparison of flat nodes and relays instead")
    parser.add_argument("--delay-ms", type=float, default=300.0,
                        help="--letters: the slow top link's delay per reply; 0 runs only "
                             "without one (default 300)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.letters:
        return letters(args)
    print(f"{platform.node()}: nproc {os.cpu_count()}, load average {load_average()}",
          file=sys.stderr, flush=True)
    runs = {
        "ddp": lambda work: baseline.run_ddp(2, args.unit, args.batch, args.ddp_seconds, work),
        "w1": lambda work: run_node(1, args.unit, args.batch, args.rounds, work / "w1"),
        "w2": lambda work: run_node(2, args.unit, args.batch, args.rounds, work / "w2"),
        "w2-ddp-batch": lambda work: run_node(2, 2 * args.unit, args.batch, args.rounds,
                                              work / "w2b"),
    }
    passes, loads = [], []
    for _ in range(args.passes):
        results, load = {}, {}
        with tempfile.TemporaryDirectory(prefix="bench-hierarchy-") as tmp:
            for key, run in runs.items():
                load[key] = load_average()
                results[key] = run(Path(tmp))
                print(f"{results[key].label}: {results[key].images_per_second:.0f} images/s",
                      file=sys.stderr, flush=True)
        passes.append(results)
        loads.append(load)
    print(report(passes, loads))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{key: {**vars(r), "images_per_second": r.images_per_second, "load": load[key]}
              for key, r in results.items()} for results, load in zip(passes, loads,
                                                                        strict=True)],
            indent=2))
    return 0



def letters(args: argparse.Namespace) -> int:
    """The letters runs through flat nodes and relays (bench/hierarchy_letters.py)."""
    print(f"{platform.node()}: nproc {os.cpu_count()}, load average {load_average()}",
          file=sys.stderr, flush=True)
    outcomes = hierarchy_letters.run_all(sorted({0.0, args.delay_ms}))
    print(hierarchy_letters.report(outcomes))
    print(f"load average at the end: {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps(hierarchy_letters.as_json(outcomes), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
