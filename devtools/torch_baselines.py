"""Plain-torch baselines of the trainer's synchronous SGD, for the throughput benches.

A user who does not run the trainer runs a single-process torch loop, or torch
DistributedDataParallel. Both baselines here train the maths of a ``sync_sgd`` round on a
torch model: each worker takes a unit of ``unit`` consecutive examples of the training
part (units in order, wrapping at its end, as sync_sgd walks it), accumulates the mean
gradient of the loss over micro-batches of ``batch`` (each weighted by its share), and one
optimizer step is taken on the mean over the workers. One torch thread per process.

* `single_process` (the loop: `SingleProcess`): one worker (global batch ``unit``);
* `ddp`: ``world`` spawned processes, gloo on 127.0.0.1 (global batch ``world x unit``);
  micro-batches before a unit's last accumulate under ``no_sync``, so one all-reduce per
  step averages the gradients.

`evaluate` scores a model on a data set as the trainer scores its validation part. A
`Workload` names what is trained by functions that can be pickled (module-level
functions or ``functools.partial`` of them): DDP's ranks are spawned processes
(devtools/throughput.py's `spawn_ranks`, which also gives the units' order and the
`PathResult` both return).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import default_collate

from devtools.throughput import PathResult, spawn_ranks, timed_ddp_steps, unit_ranges

WARMUP_STEPS = 3
Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """What both baselines train, built the same way in every process."""

    model: Callable[[], nn.Module]  # seeded: every process builds the same weights
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    data: Callable[[], Any]  # the training part: a map-style data set of (input, target)
    loss: Loss
    unit: int  # examples per worker and step
    batch: int  # micro-batch
    device: str = "cpu"  # where the single-process loop computes ("cuda": one GPU)


def take(data: Any, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Examples ``[start, stop)`` stacked, as the trainer stacks a plug-in data set's."""
    inputs, targets = default_collate([data[i] for i in range(start, stop)])
    return torch.as_tensor(inputs), torch.as_tensor(targets)


def accumulate(module: nn.Module, loss: Loss, inputs: torch.Tensor, targets: torch.Tensor,
               batch: int, last_syncs: Callable[[bool], Any] | None = None) -> None:
    """Add the mean gradient of ``loss`` over the examples (micro-batches of ``batch``,
    weighted by their share) to the parameters' ``grad``. ``last_syncs(is_last)``: a
    context for each micro-batch (DDP's ``no_sync`` on all but the last)."""
    size = len(inputs)
    starts = range(0, size, batch)
    for start in starts:
        stop = min(start + batch, size)
        context = last_syncs(start == starts[-1]) if last_syncs else contextlib.nullcontext()
        with context:
            (loss(module, inputs[start:stop], targets[start:stop]) * ((stop - start) / size)
             ).backward()


def _timed(step: Callable[[], None], seconds: float,
           device: str = "cpu") -> tuple[int, float]:
    # A GPU queues its work: wait for it at both ends so that the steps timed are done.
    finish = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(WARMUP_STEPS):
        step()
    finish()
    began, steps = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        step()
        steps += 1
    finish()
    return steps, time.perf_counter() - began


class SingleProcess:
    """The plain loop in this process, one torch thread: `step` takes one optimizer step
    on the next ``workers`` units together (a sync_sgd round of K = N = workers units of
    the same data, to the last example); ``module`` is the model trained so far."""

    def __init__(self, work: Workload, workers: int = 1) -> None:
        torch.set_num_threads(1)
        self.work, self.workers = work, workers
        self.module = work.model().to(work.device)
        self.module.train()
        self.optimizer = work.optimizer(self.module)
        self.data = work.data()
        self.ranges = unit_ranges(len(self.data), work.unit, 0, 1)

    def step(self) -> None:
        parts = [take(self.data, *next(self.ranges)) for _ in range(self.workers)]
        inputs, targets = (torch.cat(tensors).to(self.work.device)
                           for tensors in zip(*parts, strict=True))
        self.optimizer.zero_grad(set_to_none=True)
        accumulate(self.module, self.work.loss, inputs, targets, self.work.batch)
        self.optimizer.step()


def single_process(work: Workload, seconds: float) -> PathResult:
    """The plain loop, timed for about ``seconds`` after a warm-up, in this process;
    `PathResult.per_second` counts examples."""
    loop = SingleProcess(work)
    steps, elapsed = _timed(loop.step, seconds, work.device)
    where = "1 thread" if work.device == "cpu" else work.device
    return PathResult(f"single process, {where}", 1, work.unit, steps, elapsed)


@torch.no_grad()
def evaluate(module: nn.Module, loss: Loss, data: Any, batch: int = 256) -> float:
    """The mean of ``loss`` over every example of ``data`` (batches weighted by their
    size), in eval mode, as the trainer scores its validation part."""
    module.eval()
    total = 0.0
    for start in range(0, len(data), batch):
        stop = min(start + batch, len(data))
        total += float(loss(module, *take(data, start, stop))) * (stop - start)
    module.train()
    return total / len(data)


def ddp(work: Workload, world: int, seconds: float) -> PathResult:
    """``world`` DDP ranks (spawned, gloo on 127.0.0.1), timed for about ``seconds`` after
    a warm-up; every rank is joined, or terminated by its PID."""
    with tempfile.TemporaryDirectory(prefix="ddp-") as folder:
        out = Path(folder) / "measured.json"
        spawn_ranks(_ddp_rank, world, work, seconds, str(out))
        measured = json.loads(out.read_text())
    return PathResult(f"DDP gloo, {world} processes x 1 thread", world, world * work.unit,
                      measured["steps"], measured["seconds"])


def _ddp_rank(rank: int, world: int, port: int, work: Workload, seconds: float,
              out: str) -> None:
    """One rank: warm-up, agree on a step count from the warm-up's pace, time it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        module = work.model()
        module.train()
        model = DistributedDataParallel(module)
        optimizer = work.optimizer(module)
        data = work.data()
        ranges = unit_ranges(len(data), work.unit, rank, world)

        def step() -> None:
            inputs, targets = take(data, *next(ranges))
            optimizer.zero_grad(set_to_none=True)
            accumulate(model, work.loss, inputs, targets, work.batch,
                       lambda last: contextlib.nullcontext() if last else model.no_sync())
            optimizer.step()

        timed_ddp_steps(step, seconds, out, WARMUP_STEPS)
    finally:
        dist.destroy_process_group()
