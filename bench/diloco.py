"""DiLoCo against synchronous SGD on 4 nodes: validation loss at the same tokens, and bytes.

The byte-level GPT of examples/gpt (1.27 M parameters) on the standard-library corpus,
three ways, each on the same number of training tokens:

(a) a plain single-process torch loop, 1 thread: ``steps`` AdamW steps of ``nodes x
    batch`` windows of 128 bytes (devtools/torch_baselines.py), the maths of (b) on the
    same windows in the same order;
(b) sync_sgd on ``nodes`` nodes through real node, coordinator and client processes
    (examples/gpt/sync_sgd.yaml): ``steps`` rounds, each averaging the mean gradients of
    ``nodes`` units of ``batch`` windows, AdamW on the coordinator;
(c) DiLoCo on ``nodes`` nodes (examples/gpt/diloco.yaml): delta_avg with ``units`` =
    nodes, each node taking ``inner_steps`` (H) AdamW steps of ``batch`` windows on its
    range of the training windows, the coordinator applying the averaged change with
    Nesterov momentum (outer learning rate 0.7, momentum 0.9): ``steps / H`` rounds.

Validation loss: cross-entropy in nats per byte over the corpus's last 5 %, measured
``--evals`` times along each run (the runs' own evaluations for (b) and (c)). Bytes: the
client's ``--json`` (bytes_up + bytes_down, as the transport counted them). Every child
runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/diloco.py                             # about 25 minutes on 2 cores
    python bench/diloco.py --tiny --steps 50 --inner-steps 10   # a check of the bench
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools import gpt_example, torch_baselines  # noqa: E402
from devtools.gpt_example import BLOCK, SEED  # noqa: E402
from devtools.machine import describe  # noqa: E402
from devtools.throughput import train_on_cluster  # noqa: E402

RESULTS = REPO / "bench" / "results" / "diloco.json"
OUTER = {"delta_avg.server_optimizer": "nesterov", "delta_avg.server_lr": 0.7,
         "delta_avg.server_momentum": 0.9}  # the DiLoCo paper's outer step


def run_single(args: argparse.Namespace, model_args: dict[str, Any],
               root: Path) -> dict[str, Any]:
    """(a): the loop, scored every ``steps / evals`` steps."""
    work = gpt_example.workload(model_args, root, args.batch, args.batch, args.lr,
                                args.weight_decay)
    loop = torch_baselines.SingleProcess(work, workers=args.nodes)
    validation = gpt_example.windows(root, "validation")
    began, curve = time.perf_counter(), []
    for step in range(1, args.steps + 1):
        loop.step()
        if step % (args.steps // args.evals) == 0:
            loss = torch_baselines.evaluate(loop.module, gpt_example.next_byte_loss,
                                            validation)
            curve.append({"tokens": step * args.nodes * args.batch * BLOCK,
                          "validation_loss": loss})
    return {"label": "single process, 1 thread", "curve": curve,
            "seconds": time.perf_counter() - began}


def run_system(label: str, config: str, sets: dict[str, Any], tokens_per_round: int,
               args: argparse.Namespace, root: Path, workdir: Path) -> dict[str, Any]:
    """(b) or (c) through real processes on ``args.nodes`` nodes."""
    where = [*gpt_example.PLUGINS, "--data-root", str(root)]
    run = train_on_cluster(args.nodes, gpt_example.client_args(config, sets), workdir,
                           node_args=where, coordinator_args=[*where, "--no-speculation"],
                           timeout=6 * 3600)
    result = run.result
    curve = [{"tokens": row["round"] * tokens_per_round,
              "validation_loss": row["validation_loss"]} for row in result["history"]
             if not math.isnan(row["validation_loss"])]  # NaN between evaluations
    return {"label": label, "curve": curve, "seconds": result["wall_seconds"],
            "rounds": result["rounds"], "bytes_up": result["bytes_up"],
            "bytes_down": result["bytes_down"],
            "bytes": result["bytes_up"] + result["bytes_down"],
            "units": [node["accepted"] for node in result["nodes"]]}


def report(paths: dict[str, dict[str, Any]], args: argparse.Namespace,
           parameters: int) -> str:
    single, sync, diloco = paths["a"]["curve"], paths["b"]["curve"], paths["c"]["curve"]
    lines = [f"GPT {parameters:,} parameters, {args.nodes} nodes, {args.batch} windows of "
             f"{BLOCK} bytes per worker and step; (a) and (b): {args.steps} steps of "
             f"{args.nodes * args.batch} windows, AdamW lr {args.lr}; (c): "
             f"{args.steps // args.inner_steps} rounds of H = {args.inner_steps} AdamW steps "
             f"(lr {args.inner_lr}) on each node, Nesterov outer step 0.7 / 0.9", "",
             "| tokens | (a) single process | (b) sync_sgd | (c) DiLoCo | (c) / (a) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for a, b, c in zip(single, sync, diloco, strict=True):
        lines.append(f"| {a['tokens']:,} | {a['validation_loss']:.4f} | "
                     f"{b['validation_loss']:.4f} | {c['validation_loss']:.4f} | "
                     f"{c['validation_loss'] / a['validation_loss']:.3f} |")
    lines += ["", "| path | rounds | bytes up | bytes down | bytes | wall seconds |",
              "| --- | ---: | ---: | ---: | ---: | ---: |",
              f"| (a) {paths['a']['label']} | | | | | {paths['a']['seconds']:.0f} |"]
    for key in "bc":
        path = paths[key]
        lines.append(f"| ({key}) {path['label']} | {path['rounds']} | {path['bytes_up']:,} | "
                     f"{path['bytes_down']:,} | {path['bytes']:,} | {path['seconds']:.0f} |")
    lines.append(f"\n(b) / (c) bytes: **{paths['b']['bytes'] / paths['c']['bytes']:.1f}x**; "
                 f"final validation loss (c) / (a): **"
                 f"{diloco[-1]['validation_loss'] / single[-1]['validation_loss']:.3f}**")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="nodes of (b) and (c) (default 4)")
    parser.add_argument("--batch", type=int, default=8,
                        help="windows per worker and step (default 8)")
    parser.add_argument("--steps", type=int, default=1280,
                        help="steps of (a) and rounds of (b) (default 1280)")
    parser.add_argument("--inner-steps", type=int, default=64,
                        help="H, DiLoCo's inner steps per round (default 64)")
    parser.add_argument("--lr", type=float, default=0.002,
                        help="AdamW learning rate of (a) and (b) (default 0.002)")
    parser.add_argument("--inner-lr", type=float, default=0.001,
                        help="AdamW learning rate of DiLoCo's inner steps (default 0.001)")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="AdamW weight decay, every path (default 0.1)")
    parser.add_argument("--evals", type=int, default=5,
                        help="validation scores along each run (default 5)")
    gpt_example.add_output_options(parser, RESULTS.relative_to(REPO))
    args = parser.parse_args(argv)
    if args.steps % args.inner_steps or (args.steps // args.inner_steps) % args.evals:
        parser.error("--steps must be a multiple of --inner-steps x --evals")
    model_args = gpt_example.TINY_ARGS if args.tiny else gpt_example.MODEL_ARGS
    parameters = gpt_example.parameters(model_args)
    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    rounds = args.steps // args.inner_steps
    common = {"run.model_args": json.dumps(model_args), "run.seed": SEED,
              "outputs.checkpoint_every": 0}
    sync_sets = {**common, "run.rounds": args.steps,
                 "outputs.eval_every": args.steps // args.evals,
                 "sync_sgd.images_per_work_unit": args.batch,
                 "sync_sgd.batch_size": args.batch,
                 "sync_sgd.num_workunits_per_update": args.nodes,
                 "sync_sgd.units_per_iteration": args.nodes, "sync_sgd.lr": args.lr,
                 "sync_sgd.weight_decay": args.weight_decay}
    diloco_sets = {**common, **OUTER, "run.rounds": rounds,
                   "outputs.eval_every": rounds // args.evals,
                   "delta_avg.units": args.nodes, "delta_avg.local_optimizer": "adamw",
                   "delta_avg.local_steps": args.inner_steps,
                   "delta_avg.batch_size": args.batch, "delta_avg.eta": args.inner_lr,
                   "delta_avg.weight_decay": args.weight_decay}
    tokens_per_step = args.nodes * args.batch * BLOCK
    paths: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-diloco-") as tmp:
        root = gpt_example.data_root(Path(tmp) / "data")
        paths["a"] = run_single(args, model_args, root)
        print(f"(a) {paths['a']['curve'][-1]}", file=sys.stderr, flush=True)
        paths["b"] = run_system(f"sync_sgd, {args.nodes} nodes", "sync_sgd.yaml", sync_sets,
                                tokens_per_step, args, root, Path(tmp) / "sync")
        print(f"(b) {paths['b']['curve'][-1]}", file=sys.stderr, flush=True)
        paths["c"] = run_system(f"DiLoCo, {args.nodes} nodes, H = {args.inner_steps}",
                                "diloco.yaml", diloco_sets,
                                tokens_per_step * args.inner_steps, args, root,
                                Path(tmp) / "diloco")
        print(f"(c) {paths['c']['curve'][-1]}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(report(paths, args, parameters))
    out = args.out or (None if args.tiny else RESULTS)
    if out is not None:
        out.write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": load_after, "model_args": model_args,
             "parameters": parameters, "settings": vars(args) | {"out": str(out)},
             "paths": paths,
             "bytes_ratio": paths["b"]["bytes"] / paths["c"]["bytes"],
             "loss_ratio": paths["c"]["curve"][-1]["validation_loss"]
             / paths["a"]["curve"][-1]["validation_loss"]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
