"""Where an MD-GAN and an FL-GAN iteration's time goes, and what its maths alone costs.

Two measurements of the same configuration (DCGAN-28, N workers, b images per worker
batch, MD-GAN with k generated batches), one after the other on this machine:

* **maths**: the algorithms' own code in this process, one thread, no RPC: MD-GAN's
  generation (``plan_round``), a node's unit (``run_unit``: a D step and the feedback,
  also timed apart) and the G step (``aggregate``); FL-GAN's unit (a local epoch) and
  its average; scoring (IS and FID on ``--eval-n`` images).
* **system**: the real processes on 127.0.0.1 (bench/mdgan_paper.py's cluster: N nodes,
  the coordinator, the client, ``OMP_NUM_THREADS=1``), reading each round's phases from
  the coordinator's metrics.jsonl (engine/phase_clock.py) and the nodes' compute
  and busy seconds from the run's summary.

The bound an iteration should approach is its maths: generation + the nodes' units +
the G step, where N units on C cores take ceil(N / C) unit times at best (on a machine
per node, one unit time: the slowest node). The table prints both, the medians per round
of every phase, and the rest (the round's wall time less its phases).

    python bench/gan_iteration_cost.py                       # N = 5, b = 32, k = 2
    python bench/gan_iteration_cost.py --iterations 60 --fl-rounds 1 --json /tmp/c.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mdgan_paper  # noqa: E402
import torch  # noqa: E402
from gan_quality import machine  # noqa: E402

from thrift_trainer.compute_node.sessions import SessionStore  # noqa: E402
from thrift_trainer.training.algorithms.fl_gan import FLGan  # noqa: E402
from thrift_trainer.training.algorithms.md_gan import MDGan  # noqa: E402
from thrift_trainer.training.algorithms.md_gan_node import Discriminator  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.gan_training import d_step  # noqa: E402
from thrift_trainer.training.models import gan_models  # noqa: E402
from thrift_trainer.training.units import UnitJob, UnitResult  # noqa: E402

MNIST = DEFAULT_DATA_ROOT / "mnist"
OUT = mdgan_paper.REPO / "bench" / "results" / "gan_iteration_cost.json"
MS = 1000.0
PERIODIC = ("after_round", "samples")  # phases with work in some rounds only: their mean


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * MS


def _timed(call: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began


# ------------------------------------------------------------------ maths in this process


def md_gan_maths(args: argparse.Namespace, rounds: int) -> dict[str, float]:
    """Median ms of MD-GAN's generation, node unit (and its D step and feedback) and G
    step, over ``rounds`` iterations of the real code (the first one left out: warm-up)."""
    config = {"workers": args.workers, "batch_size": args.batch, "k": args.k}
    algorithm, sessions = MDGan(args.model, config, MNIST), SessionStore()
    weights = algorithm.initial_weights()
    gen, unit, g_step = [], [], []
    for r in range(1, rounds + 2):
        units, seconds = _timed(partial(algorithm.plan_round, r))
        gen.append(seconds)
        results = []
        for spec in units:
            job = UnitJob("cost", r, spec, args.model, dict(algorithm.config),
                          algorithm.unit_tensors(spec), sessions=sessions)
            output, seconds = _timed(partial(MDGan.run_unit, job, MNIST))
            unit.append(seconds)
            results.append(UnitResult(spec, output.update, output.num_samples))
        weights, seconds = _timed(partial(algorithm.aggregate, r, weights, results, []))
        g_step.append(seconds)
    d_only, feedback = _discriminator_parts(args, algorithm.config, rounds)
    return {"generation": _median_ms(gen[1:]), "node_unit": _median_ms(unit[args.workers:]),
            "d_step": d_only, "feedback": feedback, "g_step": _median_ms(g_step[1:])}


def _discriminator_parts(args: argparse.Namespace, config: dict[str, Any],
                         rounds: int) -> tuple[float, float]:
    """Median ms of one D step and of one feedback, on batches of b images (``config``:
    the MD-GAN run's, defaults filled in)."""
    spec = gan_models.gan_spec(args.model, config["batchnorm"])
    disc = Discriminator(spec, config, 0)
    real = torch.rand(args.batch, *spec.image_shape) * 2 - 1
    fake = torch.rand(args.batch, *spec.image_shape) * 2 - 1
    steps = [_timed(lambda: d_step(disc.d, disc.optimizer, real, fake))[1]
             for _ in range(rounds + 1)]
    feedbacks = [_timed(lambda: disc.feedback(fake))[1] for _ in range(rounds + 1)]
    return _median_ms(steps[1:]), _median_ms(feedbacks[1:])


def fl_gan_maths(args: argparse.Namespace) -> dict[str, float]:
    """Ms of an FL-GAN unit (one local epoch) and of the average of N units."""
    config = {"workers": args.workers, "batch_size": args.batch}
    algorithm = FLGan(args.model, config, MNIST)
    weights = algorithm.initial_weights()
    units = algorithm.plan_round(1)
    job = UnitJob("cost", 1, units[0], args.model, dict(algorithm.config), weights)
    FLGan.run_unit(job, MNIST)  # warm-up: the data set's first read
    outputs = []
    for spec in units[:2]:
        job = UnitJob("cost", 1, spec, args.model, dict(algorithm.config), weights)
        outputs.append(_timed(partial(FLGan.run_unit, job, MNIST)))
    results = [UnitResult(spec, outputs[i % 2][0].update, outputs[i % 2][0].num_samples)
               for i, spec in enumerate(units)]
    _, average = _timed(lambda: algorithm.aggregate(1, weights, results, []))
    return {"node_unit": _median_ms([seconds for _, seconds in outputs]),
            "aggregate": average * MS}


def score_ms(args: argparse.Namespace) -> float:
    """One scoring of the generator (IS and FID on ``eval_n`` images)."""
    algorithm = MDGan(args.model, {"workers": 1, "batch_size": args.batch, "k": 1}, MNIST)
    algorithm.score({}, args.eval_n)  # warm-up: the classifier and the real features
    return _timed(lambda: algorithm.score({}, args.eval_n))[1] * MS


# ------------------------------------------------------------------ the real system


def system_run(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """One run through real processes; per-round phase medians in ms, node means."""
    per_round = 1
    if method == "fl_gan":
        per_round = (mdgan_paper.mnist.N_TRAIN // args.workers) // args.batch
    iterations = args.iterations if method == "md_gan" else args.fl_rounds * per_round
    exp = mdgan_paper.Experiment(f"cost-{method}", method, method, args.model, args.workers,
                                 args.batch, iterations, k=args.k)
    settings = mdgan_paper.Settings(batch=args.batch, eval_every=iterations,
                                    eval_n=args.eval_n, seed=1, cnn=args.model, mlp=args.model)
    result = mdgan_paper.run_cluster(exp, settings, timings=True)
    summary = summarise(result, skip_first=args.skip_rounds if method == "md_gan" else 1)
    # every round's phases and unit times, for a look beyond the medians
    return {**summary, "raw": {k: result[k] for k in ("phase_seconds", "attempts")}}


def summarise(result: dict[str, Any], skip_first: int) -> dict[str, Any]:
    """Median ms per round of each phase, of the round's whole wall time (from one round's
    first unit sent to the next's) and of a unit's round trip as the coordinator sees it;
    the first ``skip_first`` rounds and the last (it scores) left out, and a phase that
    does its work every so many rounds (MD-GAN's swaps) as a mean over the kept rounds."""
    last = result["rounds"]
    kept = range(skip_first + 1, last) if last > skip_first + 1 else range(1, last + 1)
    rows = [result["phase_seconds"][r - 1] for r in kept]
    phases = {}
    for name in dict.fromkeys(name for row in rows for name in row):
        values = [row.get(name, 0.0) for row in rows]
        periodic = name in PERIODIC or not all(name in row for row in rows)
        phases[name] = (statistics.fmean(values) if periodic else statistics.median(values)) * MS
    first_sent: dict[int, float] = {}
    trips = []
    for round_index, started, ended in result["attempts"]:
        first_sent[round_index] = min(started, first_sent.get(round_index, started))
        if round_index in kept:
            trips.append(ended - started)
    walls = [first_sent[r + 1] - first_sent[r] for r in kept
             if r in first_sent and r + 1 in first_sent]
    return {"phases_ms": phases, "rounds_kept": len(rows),
            "round_wall_ms": _median_ms(walls) if walls else math.nan,
            "unit_trip_ms": _median_ms(trips) if trips else math.nan,
            "score_ms": result["phase_seconds"][-1].get("score", math.nan) * MS,
            "wall_seconds": result["seconds"], "rounds": last}


# ------------------------------------------------------------------ report


def bound_ms(unit_ms: float, workers: int, cores: int) -> float:
    """N units on C cores at best: N / C unit times (N > C processes share the cores),
    one unit time when every node has a core."""
    return workers / max(1, min(cores, workers)) * unit_ms


def md_gan_table(maths: dict[str, float], system: dict[str, Any], args: argparse.Namespace,
                 cores: int) -> list[str]:
    p = system["phases_ms"]
    total = sum(p.values())
    units_bound = bound_ms(maths["node_unit"], args.workers, cores)
    rows = [
        ("generation (G forward, k batches)", maths["generation"], p.get("plan")),
        (f"N = {args.workers} node units on {cores} cores, out and back", units_bound,
         p.get("units")),
        ("  one unit's maths (D step + feedback) / round trip", maths["node_unit"],
         system["unit_trip_ms"]),
        ("    D step / feedback", f"{maths['d_step']:.1f} / {maths['feedback']:.1f}", None),
        ("G step (backward through the k batches, Adam)", maths["g_step"], p.get("aggregate")),
        ("swaps (every E epochs; mean per iteration)", None, p.get("after_round")),
        ("ledger, evaluate, sample grid", None,
         sum(p.get(k, 0.0) for k in ("ledger", "evaluate", "samples"))),
        ("sum of the phases", maths["generation"] + units_bound + maths["g_step"], total),
        ("iteration, first unit sent to the next iteration's", None,
         system["round_wall_ms"]),
        ("the maths with a core per node (generation + a unit + G step)",
         maths["generation"] + maths["node_unit"] + maths["g_step"], None),
    ]
    return _table("MD-GAN phase", rows)


def fl_gan_table(maths: dict[str, float], system: dict[str, Any], args: argparse.Namespace,
                 cores: int) -> list[str]:
    p = system["phases_ms"]
    units_bound = bound_ms(maths["node_unit"], args.workers, cores)
    rows = [
        (f"N = {args.workers} node units (a local epoch each) on {cores} cores, out and back",
         units_bound, p.get("units")),
        ("  one unit's maths / round trip", maths["node_unit"], system["unit_trip_ms"]),
        ("average of the N pairs", maths["aggregate"], p.get("aggregate")),
        ("plan, ledger, evaluate", None,
         sum(p.get(k, 0.0) for k in ("plan", "ledger", "evaluate", "samples", "after_round"))),
        ("sum of the phases", units_bound + maths["aggregate"], sum(p.values())),
        ("round, first unit sent to the next round's", None, system["round_wall_ms"]),
        ("the maths with a core per node (a unit + the average)",
         maths["node_unit"] + maths["aggregate"], None),
    ]
    return _table("FL-GAN phase", rows)


def _table(title: str, rows: list[tuple[str, Any, Any]]) -> list[str]:
    """Markdown rows of (label, maths, measured in the system)."""
    return [f"| {title} | maths (ms) | system, median per round (ms) |", "| --- | ---: | ---: |",
            *(f"| {label} | {_ms(bound)} | {_ms(measured)} |" for label, bound, measured in rows)]


def _ms(value: float | str | None) -> str:
    """A table cell: milliseconds to 0.1, text as it is, nothing for a missing figure."""
    if isinstance(value, str):
        return value
    return "" if value is None or math.isnan(value) else f"{value:,.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dcgan28")
    parser.add_argument("--workers", type=int, default=5, help="N")
    parser.add_argument("--batch", type=int, default=32, help="b, images per worker batch")
    parser.add_argument("--k", type=int, default=2, help="MD-GAN's generated batches")
    parser.add_argument("--iterations", type=int, default=200,
                        help="MD-GAN iterations through the system")
    parser.add_argument("--skip-rounds", type=int, default=10,
                        help="MD-GAN rounds left out of the medians (warm-up)")
    parser.add_argument("--fl-rounds", type=int, default=4,
                        help="FL-GAN rounds (local epochs) through the system; the first "
                        "is left out of the medians")
    parser.add_argument("--maths-rounds", type=int, default=30,
                        help="MD-GAN iterations of the in-process maths")
    parser.add_argument("--eval-n", type=int, default=1000, help="images scored")
    parser.add_argument("--methods", default="md_gan,fl_gan")
    parser.add_argument("--json", type=Path, default=OUT, help="where the figures go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    methods = [m for m in args.methods.split(",") if m]
    record: dict[str, Any] = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine(), "load_before": os.getloadavg(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    cores = os.cpu_count() or 1
    maths = {"md_gan": lambda: md_gan_maths(args, args.maths_rounds),
             "fl_gan": lambda: fl_gan_maths(args)}
    tables = {"md_gan": md_gan_table, "fl_gan": fl_gan_table}
    lines = []
    for method in methods:
        print(f"{method}: maths in this process ...", file=sys.stderr, flush=True)
        record[method] = {"maths_ms": maths[method]()}
        print(f"{method}: through the system ...", file=sys.stderr, flush=True)
        record[method]["system"] = system_run(args, method)
        lines += tables[method](record[method]["maths_ms"], record[method]["system"], args,
                                cores) + [""]
    record["score_ms"] = score_ms(args)
    record["load_after"] = os.getloadavg()
    lines.append(f"Scoring (IS and FID on {args.eval_n} images): {record['score_ms']:,.0f} ms "
                 f"in this process. {cores} cores; load average {record['load_before'][0]:.1f} "
                 f"before, {record['load_after'][0]:.1f} after.")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
