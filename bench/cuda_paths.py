"""The GPU paths of a compute node, through real processes: the DCGAN-28 recipe's rounds on one
node computing on the CPU, on the GPU (``--device cuda``) and on the GPU through one local
worker over NCCL (``--device cuda --workers 1``), each path on a cluster of its own.

Each round is the recipe's (configs/dcgan_mnist.yaml: K = 3 of N = 4 units, Adam on the
coordinator) with units of ``--unit`` images in micro-batches of ``--batch``; evaluation,
samples and checkpoints are off. Seconds per round are the coordinator log's, from the end
of round 1 to the end of the last; a unit's seconds are the node log's.

    python bench/cuda_paths.py                 # on a machine with a GPU: about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.throughput import train_on_cluster  # noqa: E402

RESULTS = REPO / "bench" / "results" / "cuda_paths.json"
PATHS = {"cpu": ["--device", "cpu"], "cuda": ["--device", "cuda"],
         "cuda_workers1_nccl": ["--device", "cuda", "--workers", "1"]}


def run_path(node_args: list[str], client: list[str], rounds: int, workdir: Path) -> dict:
    began = time.time()
    run = train_on_cluster(1, client, workdir, node_args=node_args)
    ends = run.round_ends()
    return {"wall": time.time() - began, "round_s": (ends[rounds] - ends[1]) / (rounds - 1),
            "unit_s_mean": statistics.mean(run.unit_seconds())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each path (default 6)")
    parser.add_argument("--unit", type=int, default=256, help="images per unit (default 256)")
    parser.add_argument("--batch", type=int, default=64, help="micro-batch (default 64)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help=f"where the figures go (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    sets = {"run.rounds": args.rounds, "outputs.eval_every": 0, "outputs.sample_every": 0,
            "outputs.checkpoint_every": 0, "sync_sgd.images_per_work_unit": args.unit,
            "sync_sgd.batch_size": args.batch}
    client = ["--config", str(REPO / "configs" / "dcgan_mnist.yaml"),
              *[arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        for label, node_args in PATHS.items():
            try:
                results[label] = run_path(node_args, client, args.rounds, Path(tmp) / label)
            except RuntimeError as exc:  # say which path failed and go on to the next
                results[label] = {"error": str(exc)[-3000:]}
            print(label, json.dumps(results[label])[:300], flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
