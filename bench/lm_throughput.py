"""Byte-level GPT sync SGD throughput: our system against plain torch and DDP, in one run.

The language model of examples/gpt (gpt_model:GPT, 1.27 M parameters by default) on the
standard-library corpus (stdlib_corpus:stdlib_text, windows of 128 bytes), trained by the
same maths on every path: each worker's unit of ``unit`` windows, its mean cross-entropy
gradient over micro-batches of ``batch``, one AdamW step on the mean over the workers:

(a) a plain single-process torch loop, 1 thread (devtools/torch_baselines.py), global
    batch = unit;
(b) torch DistributedDataParallel, gloo on 127.0.0.1, 2 processes x 1 thread, each on
    ``unit`` windows (global batch = 2 x unit);
(c) our system with 1 compute node and (d) with 2, K = N = nodes, through real node,
    coordinator and client processes with ``--plugins`` (examples/gpt/sync_sgd.yaml,
    per-round evaluation and checkpoints off as the baselines have none); global batch =
    nodes x unit.

Tokens/s = global batch x 128 x steps / seconds: for (a) and (b) after a warm-up, for (c)
and (d) from the coordinator's log line of round 1 to that of round R (every per-round
cost included; start-up, round 1 and the end-of-run files excluded). Every child runs with
OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/lm_throughput.py                            # about 3 minutes
    python bench/lm_throughput.py --tiny --seconds 3         # a check of the bench itself
    python bench/lm_throughput.py --device cuda              # (a) and (c) on one GPU

With ``--device cuda`` the single-process loop runs on the GPU and the node computes there
(``compute_node.py --device cuda``); DDP and two nodes are left out (one GPU cannot hold
two NCCL ranks), and the figures go to lm_throughput_cuda.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools import gpt_example, torch_baselines  # noqa: E402
from devtools.gpt_example import BLOCK, SEED  # noqa: E402
from devtools.machine import describe  # noqa: E402
from devtools.throughput import PathResult, train_on_cluster  # noqa: E402

LR, WEIGHT_DECAY = 0.002, 0.1  # examples/gpt/sync_sgd.yaml's
RESULTS = REPO / "bench" / "results" / "lm_throughput.json"
RESULTS_CUDA = REPO / "bench" / "results" / "lm_throughput_cuda.json"
BASELINES = {"c": "a", "d": "b"}  # each path of ours and the baseline it is compared with


def run_system(nodes: int, model_args: dict[str, Any], unit: int, batch: int, rounds: int,
               data_root: Path, workdir: Path, device: str = "cpu") -> PathResult:
    """(c) or (d): ``rounds`` rounds of K = N = ``nodes`` units through real processes,
    timed from the end of round 1 to the end of round R."""
    sets = {"run.model_args": json.dumps(model_args), "run.rounds": rounds,
            "run.seed": SEED, "sync_sgd.images_per_work_unit": unit,
            "sync_sgd.batch_size": batch, "sync_sgd.num_workunits_per_update": nodes,
            "sync_sgd.units_per_iteration": nodes, "sync_sgd.lr": LR,
            "sync_sgd.weight_decay": WEIGHT_DECAY, "outputs.eval_every": 0,
            "outputs.checkpoint_every": 0}
    where = [*gpt_example.PLUGINS, "--data-root", str(data_root)]
    # On a GPU a run takes hundreds of rounds, enough to meet an honest gradient spike
    # (27x the median norm at round 9 on an H200) that the update-norm guard refuses
    # for good; the plain-torch baselines have no such guard.
    guard = [] if device == "cpu" else ["--max-update-norm", "0"]
    run = train_on_cluster(nodes, gpt_example.client_args("sync_sgd.yaml", sets), workdir,
                           node_args=[*where, "--device", device],
                           coordinator_args=[*where, "--no-speculation", *guard])
    rows = run.metrics()[1:]
    ends = run.round_ends()
    phases = {name: statistics.mean(row["phase_seconds"].get(name, 0.0) for row in rows)
              for name in rows[0]["phase_seconds"]}
    extra = {"phase_seconds": phases, "unit_compute_seconds": statistics.mean(
        run.unit_seconds()), "bytes_per_round": (run.result["bytes_up"] +
                                                 run.result["bytes_down"]) / rounds}
    on = "" if device == "cpu" else f" on {device}"
    return PathResult(f"ours, {nodes} node{'s' * (nodes > 1)}{on}", nodes, nodes * unit,
                      rounds - 1, ends[rounds] - ends[1], extra)


def tokens_per_second(path: PathResult) -> float:
    return path.per_second * BLOCK


def report(paths: dict[str, PathResult], unit: int, batch: int, parameters: int) -> str:
    lines = [f"GPT {parameters:,} parameters; unit {unit} windows of {BLOCK} bytes per "
             f"worker, micro-batch {batch}; global batch = workers x {unit}", "",
             "| path | global batch | steps timed | seconds | step (ms) | tokens/s | ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key, path in paths.items():
        base = BASELINES.get(key)
        ratio = "1 (baseline)" if base is None else \
            f"**{tokens_per_second(path) / tokens_per_second(paths[base]):.2f}x ({base})**"
        lines.append(f"| ({key}) {path.label} | {path.global_batch} | {path.updates} | "
                     f"{path.seconds:.1f} | {1000 / path.updates_per_second:.0f} | "
                     f"{tokens_per_second(path):,.0f} | {ratio} |")
    systems = [key for key in BASELINES if key in paths]
    lines += ["", "| a round of ours, means over rounds 2..R (ms) | " +
              " | ".join(f"({key})" for key in systems) + " |",
              "| --- |" + " ---: |" * len(systems),
              "| node: a unit's compute (its log) | " + " | ".join(
                  f"{1000 * paths[key].extra['unit_compute_seconds']:.1f}"
                  for key in systems) + " |"]
    for name in paths[systems[0]].extra["phase_seconds"] if systems else []:
        lines.append(f"| coordinator: phase `{name}` | " + " | ".join(
            f"{1000 * paths[key].extra['phase_seconds'][name]:.1f}" for key in systems) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit", type=int, default=32,
                        help="windows per worker and step (default 32: 4,096 tokens)")
    parser.add_argument("--batch", type=int, default=16, help="micro-batch (default 16)")
    parser.add_argument("--seconds", type=float, default=25.0,
                        help="aimed steady-state seconds of each path (default 25)")
    parser.add_argument("--device", default="cpu",
                        help="where the single process and the node compute: cpu (default) "
                             "or cuda (then only paths (a) and (c))")
    gpt_example.add_output_options(parser, RESULTS.relative_to(REPO))
    args = parser.parse_args(argv)
    gpu = args.device != "cpu"
    model_args = gpt_example.TINY_ARGS if args.tiny else gpt_example.MODEL_ARGS
    parameters = gpt_example.parameters(model_args)
    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    paths: dict[str, PathResult] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lm-") as tmp:
        root = gpt_example.data_root(Path(tmp) / "data")
        work = gpt_example.workload(model_args, root, args.unit, args.batch, LR, WEIGHT_DECAY,
                                    args.device)
        paths["a"] = torch_baselines.single_process(work, args.seconds)
        if not gpu:
            paths["b"] = torch_baselines.ddp(work, 2, args.seconds)
        for key, nodes in (("c", 1),) if gpu else (("c", 1), ("d", 2)):
            pace = paths[BASELINES[key]].updates_per_second
            rounds = 1 + max(3, math.ceil(args.seconds * pace))
            paths[key] = run_system(nodes, model_args, args.unit, args.batch, rounds, root,
                                    Path(tmp) / f"cluster-{key}", args.device)
            print(f"({key}) {paths[key].label}: {tokens_per_second(paths[key]):,.0f} tokens/s "
                  f"against {tokens_per_second(paths[BASELINES[key]]):,.0f}",
                  file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(report(paths, args.unit, args.batch, parameters))
    out = args.out or (None if args.tiny else RESULTS_CUDA if gpu else RESULTS)
    if out is not None:
        out.write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": load_after, "model_args": model_args,
             "parameters": parameters, "block": BLOCK, "unit": args.unit,
             "batch": args.batch,
             "paths": {key: {**vars(path), "tokens_per_second": tokens_per_second(path)}
                       for key, path in paths.items()},
             "device": args.device,
             "ratios": {f"{key}/{base}": tokens_per_second(paths[key])
                        / tokens_per_second(paths[base]) for key, base in BASELINES.items()
                        if key in paths}},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
