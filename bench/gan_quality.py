"""DCGAN-28 (or ``--model dcgan28-wide``) on MNIST: sync SGD through the system (N nodes,
K < N) against the standalone baseline on the same global batch for the same number of
updates; FID and IS with the project's frozen classifier, the same n and seeds for both,
every ``--eval-every`` updates.

    python bench/gan_quality.py [--updates 600] [--eval-every 600] [--unit 32] [--nodes 4]
                                [--k 3] [--seeds 1,2,3] [--set sync_sgd.lr_d=0.0004 ...]

Each finished (arm, seed) run is kept in ``--out`` (one JSON file each, named by its
settings), so an interrupted sweep started again with the same arguments skips what is
done: long sweeps can run in the background (``nohup ... &``). Each run's training state
is kept too, in ``<out>/state/`` (not in git: the system arm's coordinator run folder and
store, the baseline's weights and optimizer state at every evaluation): a run cut off
resumes from its last evaluation, and a later invocation with more ``--updates`` goes on
from a shorter run (the coordinator's ``--resume RUN --rounds N``) instead of starting
over. Every file records the machine, the load average at the start and the end, and
when it ran. Writes a markdown table of mean ± standard deviation per evaluation point to
stdout, then each arm's final level (the mean of each run's evaluations over the last
``--plateau-window`` updates) and how fast its mean FID still falls there, the final sample
grids to docs/images/ with ``--grids``, and a plot of FID against updates with ``--plot``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from devtools import local_cluster  # noqa: E402
from devtools.machine import describe  # noqa: E402
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD  # noqa: E402
from thrift_trainer.training.baselines.standalone import train_in_process  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.outputs.plots import save_grid  # noqa: E402

REPO = local_cluster.REPO
IMAGES = REPO / "docs" / "images"
ARMS = ("system", "baseline")
SCORES = ("fid_features", "fid_logits", "inception_score")
PLATEAU = 0.05  # FID still falling by more than 5 % per 1,000 updates: not at its plateau


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``sync_sgd.key=value`` overrides for both arms, values read as JSON when they
    parse (numbers, booleans), else as strings."""
    sets = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.startswith("sync_sgd."):
            raise SystemExit(f"--set takes sync_sgd.KEY=VALUE, got {item!r}")
        try:
            sets[key] = json.loads(text)
        except json.JSONDecodeError:
            sets[key] = text
    return sets


RUN_ID = "gan-quality"  # the system arm's run in its kept run folder


def kept_state(args: argparse.Namespace, arm: str, seed: int) -> Path:
    """Where (arm, seed)'s training state is kept between invocations (not in git): a
    later invocation with more ``--updates`` goes on from it, and one cut off resumes
    from its last evaluation."""
    settings = {k: v for k, v in settings_of(args, arm, seed).items() if k != "updates"}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return args.out / "state" / f"{arm}_seed{seed}_{digest}"


def resume_arguments(run_dir: Path, updates: int) -> list[str] | None:
    """The coordinator's arguments to go on with the kept run: [] for a fresh run (none
    kept, or one longer than asked, removed), ``--resume`` for one cut off, with
    ``--rounds`` for one shorter than asked; None when the kept run is done."""
    if not (run_dir / "request.json").exists():
        return []
    rounds = json.loads((run_dir / "request.json").read_text())["rounds"]
    if rounds > updates:
        shutil.rmtree(run_dir.parent.parent)
        return []
    if rounds < updates:
        return ["--resume", RUN_ID, "--rounds", str(updates)]
    finished = (run_dir / "model.npz").exists() and last_round(run_dir) == updates
    return None if finished else ["--resume", RUN_ID]


def last_round(run_dir: Path) -> int:
    """The last round in the run's metrics: a model.npz alone may be that of an earlier,
    shorter end of a run now extended. Rows are in round order (a resumed run drops the
    rows after its checkpoint), so the last row is the last round."""
    path = run_dir / "metrics.jsonl"
    rows = [line for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []
    return json.loads(rows[-1])["round"] if rows else 0


def system_run(args: argparse.Namespace, seed: int, workdir: Path) -> list[dict[str, Any]]:
    runs = kept_state(args, "system", seed) / "runs"
    resume = resume_arguments(runs / RUN_ID, args.updates)
    if resume is not None:
        _train_system(args, seed, workdir, runs, resume)
    rows = [json.loads(line) for line in
            (runs / RUN_ID / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"updates": row["round"], **{k: row[k] for k in SCORES}}
            for row in rows if row.get("fid_features") is not None]


def _train_system(args: argparse.Namespace, seed: int, workdir: Path, runs: Path,
                  resume: list[str]) -> None:
    """N nodes and a coordinator keeping its run in ``runs``; the client starts the run,
    or follows the resumed one to its end."""
    nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, "--log-level", "WARNING")
             for i in range(args.nodes)]
    coordinator = None
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(
            workdir, nodes_file, 3, "--log-level", "WARNING", *resume, run_dir=runs)
        if resume:
            print(f"  system seed {seed}: going on with the kept run ({' '.join(resume)})",
                  file=sys.stderr, flush=True)
            command = ["attach", "127.0.0.1", str(coordinator.port), RUN_ID, "--quiet"]
        else:
            command = ["127.0.0.1", str(coordinator.port), "--config",
                       str(REPO / "configs" / "dcgan_mnist.yaml"), "--quiet", "--run-id", RUN_ID]
            for key, value in _system_sets(args, seed).items():
                command += ["--set", f"{key}={value}"]
        done = local_cluster.run_client(command, workdir, timeout=24 * 3600)
        if done.returncode != 0:
            raise RuntimeError(f"system run failed: {done.stderr}")
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def _system_sets(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    return {"run.rounds": args.updates, "run.seed": seed, "run.model": args.model,
            "sync_sgd.images_per_work_unit": args.unit,
            "sync_sgd.num_workunits_per_update": args.k,
            "sync_sgd.units_per_iteration": args.nodes,
            "outputs.eval_every": args.eval_every, "outputs.sample_every": args.updates,
            "outputs.eval_n": args.n, "outputs.checkpoint_every": args.eval_every,
            **args.sets}


def baseline_algorithm(args: argparse.Namespace, seed: int) -> SyncSGD:
    """The baseline's maths: one unit of K x unit images per update."""
    torch.set_num_threads(1)
    config = {"images_per_work_unit": args.k * args.unit, "num_workunits_per_update": 1,
              "units_per_iteration": 1, "seed": seed,
              **{key.split(".", 1)[1]: value for key, value in args.sets.items()}}
    return SyncSGD(args.model, config, DEFAULT_DATA_ROOT / "mnist")


def baseline_run(args: argparse.Namespace, seed: int, workdir: Path  # noqa: ARG001
                 ) -> list[dict[str, Any]]:
    """The same maths in this process; its state is kept at every evaluation, so a later
    invocation with more updates, or one that was cut off, goes on from there."""
    algorithm = baseline_algorithm(args, seed)
    kept = kept_state(args, "baseline", seed) / "state.npz"
    done, weights, curve = load_baseline(kept, algorithm, args.updates)
    if done:
        print(f"  baseline seed {seed}: going on after update {done}", file=sys.stderr,
              flush=True)

    def on_round(update: int, weights: dict) -> None:
        if update % args.eval_every == 0 or update == args.updates:
            curve.append({"updates": update, **{k: v for k, v in algorithm.score(
                weights, args.n).items() if k in SCORES}})
            print(f"  baseline seed {seed}: {curve[-1]}", file=sys.stderr, flush=True)
            save_baseline(kept, update, weights, algorithm, curve)

    train_in_process(algorithm, args.updates, on_round, weights=weights, first_round=done + 1)
    return curve


def publish_grid(args: argparse.Namespace, arm: str, seed: int) -> Path | None:
    """Copy (arm, seed)'s final sample grid (64 samples from fixed noise) from its kept
    state to docs/images/, for a run finished now or in an earlier invocation; None when
    no state of the finished run is kept (runs that predate kept state)."""
    target = IMAGES / f"gan_quality_{args.model}_{args.updates}_{arm}_seed{seed}.png"
    if arm == "system":
        grid = (kept_state(args, arm, seed) / "runs" / RUN_ID / "samples"
                / f"round_{args.updates:05d}.png")
        if not grid.exists():
            return None
        shutil.copy(grid, target)
        return target
    algorithm = baseline_algorithm(args, seed)
    done, weights, _ = load_baseline(kept_state(args, arm, seed) / "state.npz", algorithm,
                                     args.updates)
    if done != args.updates:
        return None
    save_grid(algorithm.sample_images(weights, 64, seed=2024), target)
    return target


def save_baseline(path: Path, update: int, weights: dict[str, Any], algorithm: SyncSGD,
                  curve: list[dict[str, Any]]) -> None:
    """Weights, optimizer state and the curve so far, replaced whole (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {**{f"w.{k}": v for k, v in weights.items()},
              **{f"s.{k}": v for k, v in algorithm.state_dict().items()}}
    tmp = path.with_name("state.tmp.npz")
    np.savez(tmp, updates=np.array(update), curve=np.array(json.dumps(curve)), **arrays)
    tmp.replace(path)


def load_baseline(path: Path, algorithm: SyncSGD, updates: int
                  ) -> tuple[int, dict[str, Any] | None, list[dict[str, Any]]]:
    """(updates done, weights, curve) of the kept state, its optimizer state loaded into
    ``algorithm``; (0, None, []) when there is none or it is past ``updates``."""
    if not path.exists():
        return 0, None, []
    with np.load(path) as kept:
        done = int(kept["updates"])
        if done > updates:
            return 0, None, []
        weights = {k[2:]: kept[k] for k in kept.files if k.startswith("w.")}
        algorithm.load_state_dict({k[2:]: kept[k] for k in kept.files if k.startswith("s.")})
        return done, weights, json.loads(str(kept["curve"]))


RUNNERS: dict[str, Callable[[argparse.Namespace, int, Path], list[dict[str, Any]]]] = {
    "system": system_run, "baseline": baseline_run}


def settings_of(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """What makes a run: its file is named by a digest of these."""
    return {"arm": arm, "seed": seed, "model": args.model, "updates": args.updates,
            "eval_every": args.eval_every,
            "unit": args.unit, "nodes": args.nodes if arm == "system" else 1, "k": args.k,
            "n": args.n, "sets": args.sets}


def result_path(args: argparse.Namespace, arm: str, seed: int) -> Path:
    settings = settings_of(args, arm, seed)
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return args.out / f"{arm}_seed{seed}_{args.updates}_{digest}.json"


def machine() -> str:
    return describe(f"torch {torch.__version__}")


def run_one(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """Run (arm, seed) unless its results file exists; returns the stored record."""
    path = result_path(args, arm, seed)
    if not path.exists():
        train_one(args, arm, seed, path)
    if args.grids and publish_grid(args, arm, seed) is None:
        print(f"  {arm} seed {seed}: no kept state, no grid", file=sys.stderr, flush=True)
    return json.loads(path.read_text())


def train_one(args: argparse.Namespace, arm: str, seed: int, path: Path) -> None:
    """Train (arm, seed) and keep its record in ``path``, whole or not at all."""
    started, load_before = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-gan-") as tmp:
        curve = RUNNERS[arm](args, seed, Path(tmp))
    record = {**settings_of(args, arm, seed), "curve": curve, "machine": machine(),
              "load_average_before": list(load_before),
              "load_average_after": list(os.getloadavg()),
              "started": datetime.fromtimestamp(started, timezone.utc).isoformat(),
              "seconds": round(time.time() - started, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_text(json.dumps(record, indent=1) + "\n")
    tmp_path.replace(path)  # a run is kept whole or not at all


def mean_sd(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {spread:.1f}"


def table(records: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    points = sorted({row["updates"] for runs in records.values() for r in runs
                     for row in r["curve"]})
    lines = [f"{args.model}, global batch {args.k * args.unit}, n = {args.n}, seeds {args.seeds}; "
             f"overrides {args.sets or 'none'}", "",
             "| updates | " + " | ".join(f"{arm} FID features | {arm} IS"
                                          for arm in records) + " | system / baseline FID |",
             "| ---: |" + " ---: | ---: |" * len(records) + " ---: |"]
    for point in points:
        cells, means = [], {}
        for arm, runs in records.items():
            rows = [row for r in runs for row in r["curve"] if row["updates"] == point]
            fids = [row["fid_features"] for row in rows]
            cells += [mean_sd(fids) if fids else "", mean_sd(
                [row["inception_score"] for row in rows]) if rows else ""]
            means[arm] = statistics.mean(fids) if fids else None
        ratio = (f"{means['system'] / means['baseline']:.3f}"
                 if means.get("system") and means.get("baseline") else "")
        lines.append(f"| {point:,} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def fid_by_point(runs: list[dict[str, Any]]) -> tuple[list[int], list[list[float]]]:
    """The evaluated update counts, in order, and the runs' FIDs (features) at each."""
    points = sorted({row["updates"] for r in runs for row in r["curve"]})
    return points, [[row["fid_features"] for r in runs for row in r["curve"]
                      if row["updates"] == p] for p in points]


def improvement_per_1000(runs: list[dict[str, Any]], window: int) -> float | None:
    """How fast the seeds' mean FID still falls: the least-squares slope of the mean over
    the last ``window`` updates, per 1,000 updates, as a fraction of the fitted value at the
    end (0.05 = 5 % better per 1,000). A fit, because single scores move by 10-20 between
    evaluations; None with fewer than three evaluations in the window."""
    points, values = fid_by_point(runs)
    start = next((i for i, p in enumerate(points) if p >= points[-1] - window), 0)
    points, means = points[start:], [statistics.mean(v) for v in values[start:]]
    if len(points) < 3:
        return None
    slope, intercept = statistics.linear_regression(points, means)
    return -slope * 1000 / (slope * points[-1] + intercept)


def final_level(run: dict[str, Any], window: int) -> float:
    """A run's mean FID over its evaluations in the last ``window`` updates: its final
    level, steadier than the last evaluation alone."""
    end = run["curve"][-1]["updates"]
    return statistics.mean(row["fid_features"] for row in run["curve"]
                           if row["updates"] >= end - window)


def plateau_report(records: dict[str, list[dict[str, Any]]], window: int) -> str:
    """Each arm's final level over seeds, the system / baseline ratio of those levels, and
    whether each arm's mean FID is still falling faster than ``PLATEAU`` per 1,000."""
    levels = {arm: [final_level(r, window) for r in runs] for arm, runs in records.items()}
    lines = [f"{arm}: mean FID over the last {window:,} updates {mean_sd(values)} (seeds)"
             for arm, values in levels.items()]
    if {"system", "baseline"} <= set(levels):
        lines.append("system / baseline, last {:,} updates: {:.3f}".format(
            window, statistics.mean(levels["system"]) / statistics.mean(levels["baseline"])))
    for arm, runs in records.items():
        rate = improvement_per_1000(runs, window)
        if rate is not None:
            verdict = "still improving" if rate > PLATEAU else "plateau"
            lines.append(f"{arm}: mean FID falls {rate:.1%} per 1,000 updates over the last "
                         f"{window:,} (least squares): {verdict} (threshold {PLATEAU:.0%})")
    return "\n".join(lines)


def plot(records: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, runs in records.items():
        points, values = fid_by_point(runs)
        means = [statistics.mean(v) for v in values]
        low, high = [min(v) for v in values], [max(v) for v in values]
        ax.plot(points, means, marker="o", label=f"{arm} (mean of {len(runs)} seeds)")
        ax.fill_between(points, low, high, alpha=0.2)
    ax.set_xlabel("updates of G and D")
    ax.set_ylabel("FID (classifier features, n = 2,000)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _interrupt(signum: int, frame: object) -> None:  # noqa: ARG001 - signal signature
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=600, help="updates of G and D")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="updates between FID/IS scores (default: only at the end)")
    parser.add_argument("--model", default="dcgan28",
                        help="the 28x28 GAN of both arms (default dcgan28; dcgan28-wide)")
    parser.add_argument("--unit", type=int, default=32, help="images per work unit")
    parser.add_argument("--nodes", type=int, default=4, help="compute nodes = units per update")
    parser.add_argument("--k", type=int, default=3, help="units averaged per update (K < N)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--arms", default="system,baseline",
                        help="which arms to run: system, baseline or both (default both)")
    parser.add_argument("--n", type=int, default=2000, help="images scored (FID, IS)")
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        metavar="sync_sgd.KEY=VALUE",
                        help="a recipe setting for both arms (repeatable)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gan_quality",
                        help="folder of the per-run JSON results (kept between runs)")
    parser.add_argument("--grids", action="store_true",
                        help="copy each run's final sample grid to docs/images/ "
                             "(gan_quality_<model>_<updates>_<arm>_seed<seed>.png)")
    parser.add_argument("--plot", type=Path, default=None, help="write the FID curve here")
    parser.add_argument("--plateau-window", type=int, default=3000,
                        help="updates over which the FID trend is fitted and the final "
                             "level averaged (default 3000)")
    parser.add_argument("--json", default=None, help="also write every record to this file")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the `finally` blocks stop the nodes and the coordinator
    # this run started (by PID), and the kept state lets the next invocation go on.
    signal.signal(signal.SIGTERM, _interrupt)
    args.eval_every = args.eval_every or args.updates
    args.sets = parse_sets(args.sets)
    arms = [arm for arm in args.arms.split(",") if arm]
    if not arms or set(arms) - set(ARMS):
        parser.error(f"--arms takes {' and/or '.join(ARMS)}, got {args.arms!r}")
    IMAGES.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    records: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            records[arm].append(run_one(args, arm, seed))
            final = records[arm][-1]["curve"][-1]
            print(f"{arm} seed {seed}: {final}", file=sys.stderr, flush=True)
    print(table(records, args))
    print(plateau_report(records, args.plateau_window))
    if args.plot:
        plot(records, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
