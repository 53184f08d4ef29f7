"""DCGAN-28 on MNIST: sync SGD through the system (N nodes, K < N) against the standalone
baseline on the same global batch for the same number of updates; FID and IS with the
project's frozen classifier, the same n and seeds for both.

    python bench/gan_quality.py [--updates 600] [--unit 32] [--nodes 4] [--k 3] [--seeds 1,2,3]

Writes a markdown table to stdout, the final sample grids to docs/images/, and the scores
as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from devtools import local_cluster  # noqa: E402
from training.algorithms.sync_sgd import SyncSGD  # noqa: E402
from training.datapaths import DEFAULT_DATA_ROOT  # noqa: E402
from training.run_outputs import save_grid  # noqa: E402
from training.standalone import train_in_process  # noqa: E402

IMAGES = local_cluster.REPO / "docs" / "images"


def system_run(args: argparse.Namespace, seed: int, workdir: Path) -> dict:
    nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, "--log-level", "WARNING")
             for i in range(args.nodes)]
    coordinator = None
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 3, "--log-level",
                                                      "WARNING")
        sets = {"run.rounds": args.updates, "run.seed": seed,
                "sync_sgd.images_per_work_unit": args.unit,
                "sync_sgd.num_workunits_per_update": args.k,
                "sync_sgd.units_per_iteration": args.nodes, "outputs.eval_every": args.updates,
                "outputs.sample_every": args.updates, "outputs.eval_n": args.n,
                "outputs.checkpoint_every": args.updates}
        command = ["127.0.0.1", str(coordinator.port), "--config",
                   str(local_cluster.REPO / "configs" / "dcgan_mnist.yaml"), "--json", "--quiet"]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        started = time.monotonic()
        done = local_cluster.run_client(command, workdir, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"system run failed: {done.stderr}")
        result = json.loads(done.stdout)
        grid = Path(result["coordinator_run_dir"]) / "samples" / f"round_{args.updates:05d}.png"
        shutil.copy(grid, IMAGES / f"gan_quality_system_seed{seed}.png")
        return {**_scores(result["history"][-1]), "seconds": time.monotonic() - started}
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def _scores(row: dict) -> dict:
    return {k: row[k] for k in ("fid_features", "fid_logits", "inception_score")}


def baseline_run(args: argparse.Namespace, seed: int) -> dict:
    torch.set_num_threads(1)
    config = {"images_per_work_unit": args.k * args.unit, "num_workunits_per_update": 1,
              "units_per_iteration": 1, "seed": seed}
    algorithm = SyncSGD("dcgan28", config, DEFAULT_DATA_ROOT / "mnist")
    started = time.monotonic()
    weights = train_in_process(algorithm, args.updates)
    scores = algorithm.score(weights, args.n)
    save_grid(algorithm.sample_images(weights, 64, seed=2024),
              IMAGES / f"gan_quality_baseline_seed{seed}.png")
    return {**_scores(scores), "seconds": time.monotonic() - started}


def summary(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {spread:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=600, help="updates of G and D")
    parser.add_argument("--unit", type=int, default=32, help="images per work unit")
    parser.add_argument("--nodes", type=int, default=4, help="compute nodes = units per update")
    parser.add_argument("--k", type=int, default=3, help="units averaged per update (K < N)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--n", type=int, default=2000, help="images scored (FID, IS)")
    parser.add_argument("--json", default=None, help="also write the scores to this file")
    args = parser.parse_args(argv)
    IMAGES.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {"system": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="bench-gan-") as tmp:
        for seed in seeds:
            results["system"].append(system_run(args, seed, Path(tmp)))
            results["baseline"].append(baseline_run(args, seed))
            print(f"seed {seed}: system {results['system'][-1]}, baseline "
                  f"{results['baseline'][-1]}", file=sys.stderr, flush=True)
    print(f"| run ({args.updates} updates, global batch {args.k * args.unit}, n = {args.n}, "
          f"seeds {args.seeds}) | FID features | FID logits | IS |\n|---|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {summary(runs, 'fid_features')} | {summary(runs, 'fid_logits')} | "
              f"{summary(runs, 'inception_score')} |")
    ratio = (statistics.mean(r["fid_features"] for r in results["system"])
             / statistics.mean(r["fid_features"] for r in results["baseline"]))
    print(f"\nsystem / baseline FID (features): {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
