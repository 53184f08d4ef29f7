"""A ResNet-style CNN classifier under synchronous SGD: images/s and accuracy of our system
against plain PyTorch and DDP, in one run.

Four paths train the plug-in model of examples/cnn (``resnet_cnn:ResNetCNN``, BatchNorm)
on the 8,000 MNIST training images of the ``mnist`` data format for the same number of
epochs, from the same initial weights (seed 1, as a run's coordinator draws them), with
the same global batch G and the same optimizer (Adam, betas 0.9 / 0.999, on the mean
cross-entropy over the global batch, micro-batches of B accumulated):

(a) a plain single-process PyTorch loop, 1 thread, G images a step;
(b) torch DistributedDataParallel, gloo on 127.0.0.1, 2 processes x 1 thread, G / 2
    images each a step;
(c) our system with 1 compute node (K = N = 1, units of G images) and
(d) with 2 (K = N = 2, units of G / 2), through real node, coordinator and client
    processes (devtools.throughput), with examples/cnn/run.yaml.

The images come in the order sync_sgd's units take them: consecutive ranges of a worker's
share, the two workers of (b) and (d) taking alternate ranges. Images/s: updates 2 to R - 1
(the first update, and the last, after which the system scores the model, left out).
Accuracy: 1 - the error rate on the 2,000 held-out images after the last update, the
model in eval mode (the system's from its run's final evaluation). Every process runs
with one torch thread (OMP_NUM_THREADS=1) and is ended by its PID, and, unless
``--allocator default``, with glibc's malloc keeping freed memory
(devtools/throughput.py's `keep_freed_memory`), so that page faults weigh the same on every
path.

    python bench/cnn_throughput.py                     # about 4 minutes
    python bench/cnn_throughput.py --epochs 0.2        # a quick check of the script
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.machine import describe  # noqa: E402
from devtools.throughput import (  # noqa: E402
    PathResult,
    keep_freed_memory,
    spawn_ranks,
    train_on_cluster,
    unit_ranges,
)
from thrift_trainer.training import plugins  # noqa: E402
from thrift_trainer.training.algorithms import torch_model  # noqa: E402
from thrift_trainer.training.models.module_training import ModelSetup, evaluate  # noqa: E402

EXAMPLE = REPO / "examples" / "cnn"
RUN_CONFIG = EXAMPLE / "run.yaml"
PLUGIN = "resnet_cnn"
MODEL = f"{PLUGIN}:ResNetCNN"
SEED = 1
BETAS = (0.9, 0.999)
BASELINES = {"c": "a", "d": "b"}  # each system path and the baseline it is compared with


# ------------------------------------------------------------------ plan


def rounds_for(epochs: float, images: int, global_batch: int, workers: int) -> int:
    """Updates (rounds) that cover ``epochs`` passes when each of ``workers`` takes units
    of global_batch / workers images: at least 3, so that one is timed."""
    units_per_epoch = math.ceil(images / (global_batch // workers))
    return max(3, math.ceil(epochs * units_per_epoch / workers))


def window_images(images: int, global_batch: int, workers: int, rounds: int) -> int:
    """Images of updates 2 to ``rounds`` - 1 (the timed ones), the last unit of an
    epoch being shorter when the unit does not divide the data set."""
    unit = global_batch // workers
    ranges = unit_ranges(images, unit, 0, 1)
    sizes = [stop - start for _, (start, stop) in zip(range(rounds * workers), ranges,
                                                       strict=False)]
    return sum(sizes[workers:(rounds - 1) * workers])


def timed(label: str, workers: int, global_batch: int, rounds: int, images: int,
          seconds: float, extra: dict[str, Any]) -> PathResult:
    """A path's result over its timed updates; images/s counts the images they took."""
    result = PathResult(label, workers, global_batch, rounds - 2, seconds, extra)
    result.extra["images_timed"] = window_images(images, global_batch, workers, rounds)
    return result


def images_per_second(result: PathResult) -> float:
    return result.extra["images_timed"] / result.seconds


# ------------------------------------------------------------------ the model, as the run builds it


def example_model_args() -> dict[str, Any]:
    """run.yaml's ``run.model_args``."""
    return dict(yaml.safe_load(RUN_CONFIG.read_text())["run"].get("model_args") or {})


def model_setup(model_args: dict[str, Any]) -> ModelSetup:
    """The run's model, data set, loss and metric as a node and the coordinator read them."""
    plugins.allow([PLUGIN], EXAMPLE)
    return torch_model.setup_of(MODEL, {"model": {"args": model_args}}, "mnist",
                                REPO / "data" / "mnist")


def accuracy(setup: ModelSetup, module: nn.Module) -> float:
    """1 - the error rate on the held-out images, in eval mode (as the coordinator scores)."""
    return 1.0 - evaluate(setup, module)[0]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
               targets: torch.Tensor, batch: int) -> None:
    """One Adam step on the mean cross-entropy over ``inputs``, in micro-batches of
    ``batch`` weighted by their share. Under DDP the gradients are all-reduced (averaged
    over the ranks) with the last micro-batch only."""
    optimizer.zero_grad(set_to_none=True)
    size = len(targets)
    for first in range(0, size, batch):
        last = first + batch >= size
        quiet = model.no_sync() if isinstance(model, DistributedDataParallel) and not last \
            else contextlib.nullcontext()
        with quiet:
            scores = model(inputs[first:first + batch])
            loss = F.cross_entropy(scores, targets[first:first + batch])
            (loss * (len(scores) / size)).backward()
    optimizer.step()


def train(setup: ModelSetup, model: nn.Module, rounds: int, unit: int, rank: int,
          world: int, batch: int, lr: float) -> list[float]:
    """``rounds`` steps over this worker's ranges; the time after each step."""
    data = setup.data.train
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=BETAS)
    ranges = unit_ranges(len(data), unit, rank, world)
    model.train()
    stamps = []
    for _ in range(rounds):
        start, stop = next(ranges)
        inputs, targets = data.inputs[start:stop], data.targets[start:stop]
        train_step(model, optimizer, inputs, targets, batch)
        stamps.append(time.perf_counter())
    return stamps


# ------------------------------------------------------------------ (a) single process


def run_single(model_args: dict[str, Any], rounds: int, global_batch: int, batch: int,
               lr: float) -> PathResult:
    torch.set_num_threads(1)
    setup = model_setup(model_args)
    module = torch_model.built(setup, SEED)
    stamps = train(setup, module, rounds, global_batch, 0, 1, batch, lr)
    return timed("(a) single process, 1 thread", 1, global_batch, rounds,
                 len(setup.data.train), stamps[-2] - stamps[0],
                 {"accuracy": accuracy(setup, module)})


# ------------------------------------------------------------------ (b) DDP


def _ddp_worker(rank: int, world: int, port: int, model_args: dict[str, Any], rounds: int,
                global_batch: int, batch: int, lr: float, out_path: str) -> None:
    """One rank: its share of every step; rank 0 writes its times and the accuracy."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        setup = model_setup(model_args)
        model = DistributedDataParallel(torch_model.built(setup, SEED))
        stamps = train(setup, model, rounds, global_batch // world, rank, world, batch, lr)
        if rank == 0:
            Path(out_path).write_text(json.dumps(
                {"seconds": stamps[-2] - stamps[0], "images": len(setup.data.train),
                 "accuracy": accuracy(setup, model.module)}))
        dist.barrier()  # see spawn_ranks: the ranks tear their group down together
    finally:
        dist.destroy_process_group()


def run_ddp(model_args: dict[str, Any], rounds: int, global_batch: int, batch: int,
            lr: float, workdir: Path, world: int = 2) -> PathResult:
    out = workdir / "ddp.json"
    spawn_ranks(_ddp_worker, world, model_args, rounds, global_batch, batch, lr, str(out))
    measured = json.loads(out.read_text())
    return timed(f"(b) DDP gloo, {world} processes x 1 thread", world, global_batch, rounds,
                 measured["images"], measured["seconds"], {"accuracy": measured["accuracy"]})


# ------------------------------------------------------------------ (c), (d) our system


def client_args(nodes: int, rounds: int, global_batch: int, batch: int, lr: float,
                model_args: dict[str, Any]) -> list[str]:
    """The example's config with the bench's sizes: K = N = nodes, the model scored only
    after the last round (the baselines score nothing while they train), no checkpoints."""
    sets = {"run.rounds": rounds, "sync_sgd.images_per_work_unit": global_batch // nodes,
            "sync_sgd.batch_size": batch, "sync_sgd.num_workunits_per_update": nodes,
            "sync_sgd.units_per_iteration": nodes, "sync_sgd.lr": lr,
            "outputs.eval_every": rounds, "outputs.checkpoint_every": 0,
            "run.model_args": json.dumps(model_args)}
    return ["--config", str(RUN_CONFIG),
            *[a for key, value in sets.items() for a in ("--set", f"{key}={value}")]]


def run_system(nodes: int, rounds: int, global_batch: int, batch: int, lr: float,
               model_args: dict[str, Any], images: int, workdir: Path) -> PathResult:
    """Nodes at load 0, policy 2, no backup attempts (K = N: nothing to back up)."""
    allow = ["--plugins", PLUGIN, "--plugin-dir", str(EXAMPLE)]
    run = train_on_cluster(nodes, client_args(nodes, rounds, global_batch, batch, lr,
                                              model_args),
                           workdir, node_args=allow,
                           coordinator_args=[*allow, "--no-speculation"])
    ends = run.round_ends()
    steady = run.metrics()[1:rounds - 1]  # rounds 2 .. R - 1

    def phase_mean(name: str) -> float:
        return statistics.mean(row["phase_seconds"].get(name, 0.0) for row in steady)

    extra = {
        "accuracy": 1.0 - run.result["validation_error"],
        "wall_seconds": run.result["wall_seconds"],
        "round_seconds": statistics.mean(row["seconds"] for row in steady),
        "units_phase_seconds": phase_mean("units"),
        "aggregate_phase_seconds": phase_mean("aggregate"),
        "between_rounds_seconds": (ends[rounds - 1] - ends[1]) / (rounds - 2)
        - statistics.mean(row["seconds"] for row in steady),
        "node_unit_seconds": statistics.mean(run.unit_seconds(first_round=2)),
        "slowest_unit_seconds": statistics.mean(
            max(found) for round_index, found in run.unit_seconds_by_round().items()
            if 2 <= round_index < rounds),
    }
    label = f"({'cd'[nodes > 1]}) ours, {nodes} node{'s' * (nodes > 1)}"
    return timed(label, nodes, global_batch, rounds, images, ends[rounds - 1] - ends[1],
                 extra)


# ------------------------------------------------------------------ report


def machine() -> str:
    return (f"{describe(f'torch {torch.__version__}')}; load average "
            f"{os.getloadavg()[0]:.2f}")


def report(results: dict[str, PathResult], settings: dict[str, Any]) -> str:
    """The table of paths with each system path's ratio to its baseline, then where a
    system round's time goes."""
    lines = [f"{settings['model']} {json.dumps(settings['model_args'])}: "
             f"{settings['parameters']:,} parameters; global batch {settings['global_batch']}, "
             f"micro-batch {settings['batch']}, Adam lr {settings['lr']}, "
             f"{settings['epochs']} epochs of {settings['images']:,} images; malloc: "
             f"{settings['allocator']}", "",
             "| path | global batch | updates timed | seconds | images/s | ratio | accuracy |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for key, r in sorted(results.items()):
        base = BASELINES.get(key)
        ratio = "1 (baseline)" if base is None or base not in results else \
            f"**{images_per_second(r) / images_per_second(results[base]):.2f}x ({base})**"
        lines.append(f"| {r.label} | {r.global_batch} | {r.updates} | {r.seconds:.1f} | "
                     f"{images_per_second(r):,.0f} | {ratio} | {r.extra['accuracy']:.4f} |")
    systems = [key for key in BASELINES if key in results]
    compared = [key for key in systems if BASELINES[key] in results]
    if compared:
        lines += ["", "accuracy, system - baseline (target: within 0.01): " + ", ".join(
            f"({key}) - ({BASELINES[key]}) = "
            f"{results[key].extra['accuracy'] - results[BASELINES[key]].extra['accuracy']:+.4f}"
            for key in compared)]
    if systems:
        lines += ["", "| per round, rounds 2..R-1 (means), ms | " + " | ".join(
            f"({key})" for key in systems) + " |", "| --- |" + " ---: |" * len(systems)]
        for name, key in (("round (metrics.jsonl)", "round_seconds"),
                          ("units out and back (phase `units`)", "units_phase_seconds"),
                          ("node's unit (its log)", "node_unit_seconds"),
                          ("the round's slowest unit", "slowest_unit_seconds"),
                          ("update (phase `aggregate`)", "aggregate_phase_seconds"),
                          ("between rounds", "between_rounds_seconds")):
            lines.append(f"| {name} | " + " | ".join(
                f"{1000 * results[k].extra[key]:.1f}" for k in systems) + " |")
        lines.append("| baseline step | " + " | ".join(
            f"{1000 / results[BASELINES[k]].updates_per_second:.1f}"
            for k in systems if BASELINES[k] in results) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=float, default=8.0,
                        help="passes over the 8,000 training images, every path (default 8)")
    parser.add_argument("--global-batch", type=int, default=512,
                        help="images per update, every path (default 512: units of 512 on "
                             "1 node, 256 on each of 2)")
    parser.add_argument("--batch", type=int, default=128,
                        help="micro-batch size (sync_sgd batch_size; default 128)")
    parser.add_argument("--lr", type=float, default=0.004, help="Adam's learning rate")
    parser.add_argument("--model-args", default=None,
                        help="JSON of the model's arguments (default: run.yaml's)")
    parser.add_argument("--paths", default="acbd",
                        help="which paths to run, in this order (default acbd: each system "
                             "path right after its baseline)")
    parser.add_argument("--allocator", choices=("kept", "default"), default="kept",
                        help="kept (default): glibc's malloc keeps freed memory in every "
                             "process; default: its own thresholds")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.global_batch % 2:
        parser.error("--global-batch must be even (2 workers share it)")
    kept = args.allocator == "kept" and keep_freed_memory()  # before the data is read
    model_args = json.loads(args.model_args) if args.model_args else example_model_args()
    setup = model_setup(model_args)
    images = len(setup.data.train)
    settings = {"model": MODEL, "model_args": model_args,
                "parameters": sum(p.numel() for p in setup.build().parameters()),
                "global_batch": args.global_batch, "batch": args.batch, "lr": args.lr,
                "epochs": args.epochs, "images": images,
                "allocator": "freed memory kept" if kept else "glibc's defaults"}
    load_before = os.getloadavg()
    print(machine(), file=sys.stderr, flush=True)
    results: dict[str, PathResult] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cnn-") as tmp:
        for key in args.paths:
            workers = 1 if key in "ac" else 2
            rounds = rounds_for(args.epochs, images, args.global_batch, workers)
            common = (rounds, args.global_batch, args.batch, args.lr)
            if key == "a":
                results[key] = run_single(model_args, *common)
            elif key == "b":
                results[key] = run_ddp(model_args, *common, Path(tmp))
            else:
                results[key] = run_system(workers, *common, model_args, images,
                                          Path(tmp) / f"cluster{key}")
            r = results[key]
            print(f"{r.label}: {images_per_second(r):.0f} images/s, accuracy "
                  f"{r.extra['accuracy']:.4f} ({rounds} updates)", file=sys.stderr, flush=True)
    print(report(results, settings))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"settings": settings, "machine": machine(),
             "load_average_before": load_before, "load_average_after": os.getloadavg(),
             "paths": {k: {**vars(r), "images_per_second": images_per_second(r)}
                       for k, r in results.items()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
