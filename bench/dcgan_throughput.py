"""DCGAN-28 synchronous SGD throughput: our system against plain PyTorch and DDP, in one run.

Four paths train the same maths on the same global batch (simultaneous gradients of D's
real + fake BCE and G's non-saturating BCE from one (G, D) version, over ``unit`` images
per worker in micro-batches of ``batch``, then one Adam step on G and one on D):

(a) a plain single-process PyTorch loop, one thread, global batch = unit;
(b) torch DistributedDataParallel (gloo, 127.0.0.1), 2 processes x 1 thread, each on
    ``unit`` images (global batch = 2 x unit), one wrapper module holding G and D so that
    one all-reduce covers both gradients;
(c) our system with 1 compute node and (d) with 2, K = N = nodes, through real node,
    coordinator and client processes (devtools.local_cluster); global batch = nodes x unit;
(e) and (f): (c) and (d) in asynchronous mode with units sent ahead
    (``schedule.mode=async``, ``schedule.prefetch=1``): each node holds its next unit while
    it computes, so the round trip and the coordinator's update leave its critical path
    (each gradient is then computed from weights one or two versions old).

Images/s = global batch x updates / seconds, start-up and the first update (or round)
excluded. Every child runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/dcgan_throughput.py                       # about 3-4 minutes
    python bench/dcgan_throughput.py --unit 320 --batch 32 # the reference's units
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.machine import cpu_model  # noqa: E402
from devtools.throughput import (  # noqa: E402
    PathResult,
    spawn_ranks,
    timed_ddp_steps,
    train_on_cluster,
    unit_ranges,
)
from thrift_trainer.training.algorithms import sync_gan, sync_sgd  # noqa: E402
from thrift_trainer.training.data import mnist  # noqa: E402
from thrift_trainer.training.models import gan_models  # noqa: E402
from thrift_trainer.training.outputs.model_file import save_model  # noqa: E402
from thrift_trainer.training.units import UnitJob  # noqa: E402
from thrift_trainer.wire.tensor_codec import dict_to_wire  # noqa: E402

MODEL = "dcgan28"
LR, BETAS = 2e-4, (0.5, 0.999)
WARMUP_STEPS = 3


# ------------------------------------------------------------------ shared maths


def training_images() -> torch.Tensor:
    """The 8,000-image MNIST training part as (n, 1, 28, 28) float32 in [-1, 1]."""
    return mnist.to_model_input(mnist.training_part()[0])


def build() -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, torch.optim.Optimizer]:
    """G, D (seed 1, as a run's coordinator) and one Adam each, in training mode."""
    g, d = gan_models.build_gan(gan_models.gan_spec(MODEL), seed=1)
    g.train()
    d.train()
    return (g, d, torch.optim.Adam(g.parameters(), lr=LR, betas=BETAS),
            torch.optim.Adam(d.parameters(), lr=LR, betas=BETAS))


def losses(real_logits: torch.Tensor,
           fake_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """D's BCE on reals (1) and fakes (0); G's non-saturating BCE on fakes (1)."""
    d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
              + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))
    g_loss = F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))
    return d_loss, g_loss


# ------------------------------------------------------------------ (a) single process


def single_step(g: nn.Module, d: nn.Module, opt_g: torch.optim.Optimizer,
                opt_d: torch.optim.Optimizer, real: torch.Tensor, z: torch.Tensor,
                batch: int) -> None:
    """One simultaneous update: mean gradients of D and G over ``real`` (micro-batches of
    ``batch``, weighted by their share) from the same version, then Adam on both."""
    g_params, d_params = list(g.parameters()), list(d.parameters())
    opt_g.zero_grad(set_to_none=False)
    opt_d.zero_grad(set_to_none=False)
    n = len(real)
    for start in range(0, n, batch):
        share = len(real[start:start + batch]) / n
        fake = g(z[start:start + batch])
        d_loss, g_loss = losses(d(real[start:start + batch]), d(fake))
        for p, grad in zip(d_params, torch.autograd.grad(d_loss * share, d_params,
                                                         retain_graph=True), strict=True):
            p.grad += grad
        for p, grad in zip(g_params, torch.autograd.grad(g_loss * share, g_params),
                           strict=True):
            p.grad += grad
    opt_g.step()
    opt_d.step()


def run_single(unit: int, batch: int, seconds: float) -> PathResult:
    """(a): steps until ``seconds`` of steady state have passed, after a warm-up."""
    torch.set_num_threads(1)
    images = training_images()
    g, d, opt_g, opt_d = build()
    for p in [*g.parameters(), *d.parameters()]:
        p.grad = torch.zeros_like(p)
    noise = torch.Generator().manual_seed(7)
    ranges = unit_ranges(len(images), unit, 0, 1)

    def step() -> int:
        start, stop = next(ranges)
        z = torch.randn(stop - start, g.z_dim, generator=noise)
        single_step(g, d, opt_g, opt_d, images[start:stop], z, batch)
        return stop - start

    for _ in range(WARMUP_STEPS):
        step()
    began, steps, seen = time.perf_counter(), 0, 0
    while time.perf_counter() - began < seconds:
        seen += step()
        steps += 1
    elapsed = time.perf_counter() - began
    return PathResult("(a) single process, 1 thread", 1, unit, steps, elapsed,
                      {"images_seen": seen})


# ------------------------------------------------------------------ (b) DDP


class GanPair(nn.Module):
    """G and D in one module, so that one DDP reducer (one bucket: 1.1 MB) averages both
    networks' gradients in one all-reduce."""

    def __init__(self, g: nn.Module, d: nn.Module) -> None:
        super().__init__()
        self.g, self.d = g, d

    def forward(self, real: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.d(real), self.d(self.g(z))


def ddp_step(model: DistributedDataParallel, opt_g: torch.optim.Optimizer,
             opt_d: torch.optim.Optimizer, real: torch.Tensor, z: torch.Tensor,
             batch: int) -> None:
    """The same maths as :func:`single_step` on this rank's share. D's gradient of the D loss
    and G's gradient of the G loss come from two backward calls restricted by ``inputs``
    (no cross terms); DDP's hooks fire as each parameter's gradient is accumulated and the
    all-reduce (averaging over ranks) runs once every parameter of G and D is ready.
    Micro-batches before the last accumulate locally under ``no_sync``."""
    pair: GanPair = model.module
    g_params, d_params = list(pair.g.parameters()), list(pair.d.parameters())
    opt_g.zero_grad(set_to_none=True)
    opt_d.zero_grad(set_to_none=True)
    n = len(real)
    starts = list(range(0, n, batch))
    for start in starts:
        share = len(real[start:start + batch]) / n
        sync = start == starts[-1]
        with contextlib.nullcontext() if sync else model.no_sync():
            real_logits, fake_logits = model(real[start:start + batch], z[start:start + batch])
            d_loss, g_loss = losses(real_logits, fake_logits)
            torch.autograd.backward(g_loss * share, inputs=g_params, retain_graph=True)
            torch.autograd.backward(d_loss * share, inputs=d_params)
    opt_g.step()
    opt_d.step()


def _ddp_worker(rank: int, world: int, port: int, unit: int, batch: int, seconds: float,
                out_path: str) -> None:
    """One DDP rank: warm-up, agree on a step count from the warm-up's pace, time it."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        images = training_images()
        g, d, opt_g, opt_d = build()
        model = DistributedDataParallel(GanPair(g, d))
        noise = torch.Generator().manual_seed(7 + rank)
        ranges = unit_ranges(len(images), unit, rank, world)

        def step() -> None:
            start, stop = next(ranges)
            z = torch.randn(stop - start, g.z_dim, generator=noise)
            ddp_step(model, opt_g, opt_d, images[start:stop], z, batch)

        timed_ddp_steps(step, seconds, out_path, WARMUP_STEPS)
    finally:
        dist.destroy_process_group()


def run_ddp(world: int, unit: int, batch: int, seconds: float, workdir: Path) -> PathResult:
    """(b): spawn ``world`` ranks; each process is joined, or terminated by its PID."""
    out = workdir / "ddp.json"
    spawn_ranks(_ddp_worker, world, unit, batch, seconds, str(out))
    measured = json.loads(out.read_text())
    return PathResult(f"(b) DDP gloo, {world} processes x 1 thread", world, world * unit,
                      measured["steps"], measured["seconds"])


# ------------------------------------------------------------------ (c), (d) our system


def run_system(nodes: int, unit: int, batch: int, rounds: int, policy: int,
               speculation: bool, recipe_outputs: bool, workdir: Path,
               prefetch: int = 0) -> PathResult:
    """Nodes (load 0), coordinator and client as processes. Steady state: the span between
    the coordinator's log lines of round 1 and round R (R - 1 updates, every per-round cost
    included, start-up and end-of-run files excluded); the client's wall time minus the
    first round is kept too (``wall_minus_first``)."""
    sets = {"run.model": MODEL, "run.rounds": rounds,
            "sync_sgd.images_per_work_unit": unit, "sync_sgd.batch_size": batch,
            "sync_sgd.num_workunits_per_update": nodes,
            "sync_sgd.units_per_iteration": nodes}
    if prefetch:
        sets.update({"schedule.mode": "async", "schedule.prefetch": prefetch})
    if not recipe_outputs:  # scoring, grids and checkpoints are not training; the
        # baselines do none of them
        sets.update({"outputs.eval_every": 0, "outputs.sample_every": 0,
                     "outputs.checkpoint_every": 0})
    args = ["--config", "configs/dcgan_mnist.yaml",
            *[a for key, value in sets.items() for a in ("--set", f"{key}={value}")],
            "--out", str(workdir / "models")]
    run = train_on_cluster(nodes, args, workdir, policy=policy,
                           coordinator_args=[] if speculation else ["--no-speculation"])
    result = run.result
    history = result["history"]
    steady = history[1:]
    ends = run.round_ends()
    unit_seconds = run.unit_seconds()
    seconds = ends[result["rounds"]] - ends[1]
    wall_minus_first = result["wall_seconds"] - history[0]["seconds"]
    accepted = sum(n["accepted"] for n in result["nodes"])
    per_unit = {key: sum(n[key] for n in result["nodes"]) / max(accepted, 1)
                for key in ("busy_seconds", "compute_seconds")}
    metric_rows = run.metrics()
    extra = {
        "rounds": result["rounds"],
        "wall_seconds": result["wall_seconds"],
        "wall_minus_first": wall_minus_first,
        "wall_minus_first_images_per_second": nodes * unit * len(steady) / wall_minus_first,
        "outputs": "recipe" if recipe_outputs else "eval_every=0 sample_every=0",
        "first_round_seconds": history[0]["seconds"],
        "round_seconds": statistics.mean(h["seconds"] for h in steady),
        "metrics_jsonl_round_seconds": statistics.mean(r["seconds"] for r in metric_rows[1:]),
        "update_seconds": statistics.mean(h["update_seconds"] for h in steady),
        "between_rounds_seconds": (seconds - sum(h["seconds"] for h in steady)) / len(steady),
        "dispatch_seconds": statistics.mean(h["seconds"] - h["update_seconds"]
                                            for h in steady),
        "unit_compute_steady_seconds": statistics.mean(unit_seconds),
        "unit_compute_seconds": per_unit["compute_seconds"],
        "unit_busy_seconds": per_unit["busy_seconds"],
        "accepted": accepted,
        "rejected": sum(n["rejected"] for n in result["nodes"]),
        "cancelled": sum(n["cancelled"] for n in result["nodes"]),
    }
    key = "cd"[nodes > 1] if not prefetch else "ef"[nodes > 1]
    how = f", async, prefetch {prefetch}" if prefetch else ""
    return PathResult(f"({key}) ours, {nodes} node{'s' * (nodes > 1)}{how}",
                      nodes, nodes * unit, len(steady), seconds, extra)


# ------------------------------------------------------------------ fixed costs, in process


def median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def fixed_costs(unit: int, batch: int, reps: int, workdir: Path) -> dict[str, float]:
    """Per-round costs of our system's maths measured in this process (1 thread):
    the node's whole unit (sync_sgd.run_unit) against the bare maths, and the coordinator's
    apply (Adam), evaluate, weights encoding and checkpoint."""
    torch.set_num_threads(1)
    config = {"images_per_work_unit": unit, "batch_size": batch,
              "num_workunits_per_update": 1, "units_per_iteration": 1}
    data_dir = REPO / "data" / "mnist"
    algo = sync_sgd.SyncSGD(MODEL, config, data_dir)
    weights = algo.initial_weights()
    unit_spec = algo.plan_round(1)[0]
    job = UnitJob(run_id="bench", round=1, unit=unit_spec, model=MODEL,
                  config=algo.config, weights=weights)
    output = sync_sgd.SyncSGD.run_unit(job, data_dir)
    g, d = gan_models.build_gan(gan_models.gan_spec(MODEL), seed=1)
    real = training_images()[:unit]
    z = torch.randn(unit, g.z_dim)
    costs = {
        "node: run_unit (build G/D, load weights, maths, float32 copies)":
            median_ms(lambda: sync_sgd.SyncSGD.run_unit(job, data_dir), reps),
        "node: bare maths (gan_unit_update)":
            median_ms(lambda: sync_gan.gan_unit_update(g, d, real, z, batch), reps),
        "node: build_gan + load weights":
            median_ms(lambda: [gan_models.numpy_to_state(m, weights, p) for m, p in zip(
                gan_models.build_gan(gan_models.gan_spec(MODEL)), ("G.", "D."),
                strict=True)], reps),
        "coordinator: apply (load weights, set grads, Adam G + D, buffers)":
            median_ms(lambda: algo.apply(weights, output.update), reps),
        "coordinator: evaluate (probe of 64 + 64)":
            median_ms(lambda: algo.evaluate(weights), reps),
        "coordinator: dict_to_wire(weights)": median_ms(lambda: dict_to_wire(weights), reps),
        "coordinator: checkpoint.npz (weights + Adam state)":
            median_ms(lambda: save_model(
                workdir / "checkpoint.npz",
                {**weights, **{f"optimizer.{k}": v for k, v in algo.state_dict().items()}},
                algo.model_description()), reps),
    }
    return costs


def wire_bytes() -> dict[str, int]:
    """Float32 bytes one unit moves (computed from the arrays sync_sgd sends; Thrift's
    names, shapes and framing are not counted)."""
    g, d = gan_models.build_gan(gan_models.gan_spec(MODEL))
    weights = {**gan_models.state_to_numpy(g, "G."), **gan_models.state_to_numpy(d, "D.")}
    params = sum(p.numel() for m in (g, d) for p in m.parameters())
    buffers = sum(b.numel() for m in (g, d) for b in m.buffers())
    return {"down": sum(a.nbytes for a in weights.values()), "up": 4 * (params + buffers),
            "params": params, "buffers": buffers}


# ------------------------------------------------------------------ report


def machine() -> str:
    load = os.getloadavg()[0]
    return (f"nproc {os.cpu_count()}, {cpu_model()}, Linux {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"numpy {np.__version__}; load average {load:.2f} at the start")


SYSTEM_PATHS = {"c": (1, 0), "d": (2, 0), "e": (1, 1), "f": (2, 1)}  # key: (nodes, prefetch)


def report(results: dict[str, PathResult], costs: dict[str, float], sizes: dict[str, int],
           unit: int, batch: int) -> str:
    base = {key: "a" if SYSTEM_PATHS[key][0] == 1 else "b" for key in SYSTEM_PATHS}
    systems = [key for key in SYSTEM_PATHS if key in results]
    lines = [f"unit {unit} images per worker, micro-batch {batch}; global batch = workers x "
             f"{unit}", "",
             "| path | global batch | updates timed | seconds | images/s | ratio |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for key, r in results.items():
        ratio = ("1 (baseline)" if key in "ab" else
                 f"{r.per_second / results[base[key]].per_second:.2f}x "
                 f"({base[key]})")
        lines.append(f"| {r.label} | {r.global_batch} | {r.updates} | {r.seconds:.1f} | "
                     f"{r.per_second:.0f} | {ratio} |")
    ratio_ba = results["b"].per_second / results["a"].per_second
    lines.append(f"| (b) / (a) | | | | | {ratio_ba:.2f}x |")
    for key in systems:
        r = results[key]
        alt = r.extra["wall_minus_first_images_per_second"]
        lines.append(f"| {r.label}, client wall time minus round 1 | {r.global_batch} | "
                     f"{r.updates} | {r.extra['wall_minus_first']:.1f} | {alt:.0f} | "
                     f"{alt / results[base[key]].per_second:.2f}x ({base[key]}) |")
    lines += ["", "| per round (rounds 2..R, means) | " + " | ".join(
                  f"({key})" for key in systems) + " |",
              "| --- |" + " ---: |" * len(systems)]
    rows = [("round seconds (history)", "round_seconds"),
            ("round seconds (metrics.jsonl)", "metrics_jsonl_round_seconds"),
            ("update_seconds (apply + evaluate)", "update_seconds"),
            ("between rounds (outputs, checkpoint, ledger, metrics)",
             "between_rounds_seconds"),
            ("round minus update (send, node, reply, average)", "dispatch_seconds"),
            ("node compute per unit (run_unit, rounds 2..R, node logs)",
             "unit_compute_steady_seconds"),
]
    for name, key in rows:
        lines.append(f"| {name} | " + " | ".join(
            f"{1000 * results[k].extra[key]:.1f} ms" for k in systems) + " |")
    lines.append(f"| single-process step (a), for comparison: "
                 f"{1000 / results['a'].updates_per_second:.1f} ms; DDP step (b): "
                 f"{1000 / results['b'].updates_per_second:.1f} ms |" + " |" * len(systems))
    lines += ["", "| fixed cost, in process, 1 thread | median ms |", "| --- | ---: |"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in costs.items()]
    down, up = sizes["down"], sizes["up"]
    lines += ["", f"bytes per unit (computed from float32 arrays): down {down:,} "
              f"({sizes['params']:,} params + {sizes['buffers']:,} buffer values), "
              f"up {up:,}; per iteration: 1 node {down + up:,}, 2 nodes {2 * (down + up):,}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit", type=int, default=64,
                        help="images per worker per update (images_per_work_unit; default 64)")
    parser.add_argument("--batch", type=int, default=64,
                        help="micro-batch size (sync_sgd batch_size; default 64)")
    parser.add_argument("--baseline-seconds", type=float, default=15.0,
                        help="steady-state seconds of (a) and of (b) (default 15)")
    parser.add_argument("--system-seconds", type=float, default=25.0,
                        help="aimed steady-state seconds of (c) and (d); rounds are derived "
                             "from the baselines' pace (default 25)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of (c) and (d), overriding --system-seconds")
    parser.add_argument("--policy", type=int, default=2, choices=(2, 3),
                        help="coordinator scheduling policy (default 2)")
    parser.add_argument("--speculation", action="store_true",
                        help="leave backup attempts on (default: --no-speculation)")
    parser.add_argument("--outputs", choices=("off", "recipe"), default="off",
                        help="off (default): no IS/FID scoring, sample grids or checkpoints "
                             "during the run, like the baselines; recipe: the recipe's outputs")
    parser.add_argument("--prefetch", type=int, default=1,
                        help="units sent ahead in paths (e) and (f), asynchronous mode; 0 "
                             "leaves those paths out (default 1)")
    parser.add_argument("--cost-reps", type=int, default=15,
                        help="repetitions of each in-process fixed-cost timing (default 15)")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    print(machine(), file=sys.stderr, flush=True)
    results: dict[str, PathResult] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dcgan-") as tmp:
        work = Path(tmp)
        results["a"] = run_single(args.unit, args.batch, args.baseline_seconds)
        print(f"{results['a'].label}: {results['a'].per_second:.0f} images/s",
              file=sys.stderr, flush=True)
        results["b"] = run_ddp(2, args.unit, args.batch, args.baseline_seconds, work)
        print(f"{results['b'].label}: {results['b'].per_second:.0f} images/s",
              file=sys.stderr, flush=True)
        for key, (nodes, prefetch) in SYSTEM_PATHS.items():
            if prefetch and not args.prefetch:
                continue
            pace = results["a" if nodes == 1 else "b"].updates_per_second
            # Ours ran at 0.7-1x its baseline's pace here: aim at the middle.
            rounds = args.rounds or 1 + max(2, math.ceil(args.system_seconds * pace * 0.85))
            results[key] = run_system(nodes, args.unit, args.batch, rounds, args.policy,
                                      args.speculation, args.outputs == "recipe",
                                      work / f"cluster{key}", prefetch * args.prefetch)
            print(f"{results[key].label}: {results[key].per_second:.0f} images/s "
                  f"({rounds} rounds)", file=sys.stderr, flush=True)
        costs = fixed_costs(args.unit, args.batch, args.cost_reps, work)
    sizes = wire_bytes()
    print(report(results, costs, sizes, args.unit, args.batch))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"unit": args.unit, "batch": args.batch, "machine": machine(),
             "paths": {k: {**vars(r), "images_per_second": r.per_second}
                       for k, r in results.items()},
             "fixed_costs_ms": costs, "bytes": sizes}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
