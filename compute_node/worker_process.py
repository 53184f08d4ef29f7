"""One local worker of a multi-worker node: a rank of the node's torch.distributed group.

The node (compute_node/local_workers.py) starts W of these once, with `spawn`. Each joins
the group (gloo on the CPU; NCCL with one GPU per worker), then loops: take a unit's
share from its pipe, compute it (`Algorithm.run_unit_part`) from the weights the node
put in shared memory, all-reduce the sample-weighted sums with the other workers, and
answer. Rank 0's answer carries the unit's result. A worker ends when its pipe closes,
and at once when the node dies (a thread waits on the node's process sentinel), so no
worker outlives its node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import parent_process
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.unit_parts import cast_like
from thrift_trainer.training.units import UnitJob, UnitOutput, UnitSpec, Weights

if TYPE_CHECKING:
    import torch

# torch is imported by the workers themselves (worker_main), not by the node that only
# spawns them: a node process must start in well under a second.

# A share waits in the all-reduce for the slowest share of its unit; a dead peer ends
# the wait at once (its sockets close), so this only bounds a worker that hangs.
COLLECTIVE_TIMEOUT = timedelta(hours=1)
CANCEL, BATCHES = 0, 1  # slots of the shared control array: the flag, then one per rank
ALIGN = 64  # bytes: each tensor of a shared block starts on a cache line


@dataclass(frozen=True)
class WorkerSetup:
    """How a worker joins its node's group."""

    rank: int
    world: int
    backend: str  # gloo or nccl
    store: str  # file of the group's FileStore, new for every group the node starts
    device: str  # cpu, or this worker's cuda:<rank>
    threads: int
    # the node's plug-ins (training/plugins.py `startup`): the worker allows the same
    plugins: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


Placed = tuple[str, str, tuple[int, ...], int]  # name, dtype, shape, offset in a block


def block_layout(tensors: Iterable[tuple[str, Any, tuple[int, ...]]]) -> tuple[tuple[Placed, ...],
                                                                                int]:
    """Where tensors of these (name, dtype, shape) lie in one shared block, each on a cache
    line of its own, and the block's size."""
    placed, size = [], 0
    for name, dtype, shape in tensors:
        dtype = np.dtype(dtype)
        placed.append((name, dtype.str, tuple(shape), size))
        size += -(-int(np.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN
    return tuple(placed), max(size, ALIGN)


@dataclass(frozen=True)
class WeightsLayout:
    """Where each weight tensor lies in the node's shared memory block."""

    block: str  # the SharedMemory name
    tensors: tuple[Placed, ...]


@dataclass(frozen=True)
class ShareTask:
    """A unit as the node sends it to each of its workers; rank r computes share r."""

    algorithm: str  # as the request names it (a plug-in's module:Class too)
    run_id: str
    round: int
    unit: UnitSpec
    model: str
    config: dict[str, Any]
    weights: WeightsLayout
    data_dir: str
    dataset: str = ""
    checked_config: Mapping[str, Any] | None = None  # as the node checked it for the run


@dataclass(frozen=True)
class SharedOutput:
    """A unit's output that rank 0 wrote into a shared memory block of its own: the pipe
    carries only this description, and the node maps the block (no copy of the update
    travels through the pipe) and unlinks it (compute_node.local_workers)."""

    block: str  # the SharedMemory name
    tensors: tuple[Placed, ...]
    num_samples: int
    loss: float
    error: float
    loss_before: float | None = None  # a client's loss before training, where measured


@dataclass
class Reply:
    """A worker's answer: done (rank 0 holds the output), cancelled, or failed."""

    status: str
    output: SharedOutput | None = None
    message: str = ""
    request_error: bool = False  # the unit cannot work here (the caller's fault)


class SharedStep(UnitControl):
    """The unit's cancel flag and batch count in memory shared with the node."""

    def __init__(self, shared: Any, rank: int) -> None:
        super().__init__()
        self._shared, self._rank = shared, rank

    def step(self) -> None:
        if self._shared[CANCEL]:
            raise UnitCancelled("unit cancelled")
        self._shared[BATCHES + self._rank] += 1


@dataclass
class _Attached:
    """Shared memory blocks this worker has opened, by name (the node grows its block)."""

    blocks: dict[str, SharedMemory] = field(default_factory=dict)

    def weights(self, layout: WeightsLayout) -> Weights:
        """Read-only views of the weights: no copy is made in the worker."""
        if layout.block not in self.blocks:
            self._forget_others()
            self.blocks[layout.block] = SharedMemory(layout.block)
        buffer = self.blocks[layout.block].buf
        views = {}
        for name, dtype, shape, offset in layout.tensors:
            view = np.ndarray(shape, np.dtype(dtype), buffer=buffer, offset=offset)
            view.flags.writeable = False
            views[name] = view
        return views

    def _forget_others(self) -> None:
        for block in self.blocks.values():
            with contextlib.suppress(BufferError):  # a view still held: freed with it
                block.close()
        self.blocks.clear()


def worker_main(setup: WorkerSetup, conn: Connection, shared: Any) -> None:
    """A worker's life: join the group, say ready, serve shares until the pipe closes."""
    import torch
    import torch.distributed as dist

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the node's to handle
    _end_with_node()
    plugins.allow_again(setup.plugins)
    torch.set_num_threads(setup.threads)
    if setup.device.startswith("cuda"):
        torch.cuda.set_device(setup.device)
    dist.init_process_group(setup.backend, init_method=f"file://{setup.store}",
                            rank=setup.rank, world_size=setup.world,
                            timeout=COLLECTIVE_TIMEOUT)
    conn.send(("ready", os.getpid()))
    attached = _Attached()
    try:
        while (task := _receive(conn)) is not None:
            conn.send(run_share(task, setup, shared, attached))
    finally:
        attached._forget_others()
        dist.destroy_process_group()


def _receive(conn: Connection) -> ShareTask | None:
    try:
        return conn.recv()
    except EOFError:  # the node closed its end
        return None


def _end_with_node() -> None:
    """Exit as soon as the node process ends, however it ends (even SIGKILL)."""
    node = parent_process()
    if node is not None:
        threading.Thread(target=lambda: (wait([node.sentinel]), os._exit(1)),
                         daemon=True).start()


def run_share(task: ShareTask, setup: WorkerSetup, shared: Any, attached: _Attached) -> Reply:
    """This rank's share of the unit, combined with the others' by all-reduce."""
    job = UnitJob(task.run_id, task.round, task.unit, task.model, task.config,
                  attached.weights(task.weights), device=setup.device,
                  control=SharedStep(shared, setup.rank), dataset=task.dataset,
                  checked_config=task.checked_config)
    output, reply = None, None
    try:
        output = get_algorithm(task.algorithm).run_unit_part(
            job, Path(task.data_dir), setup.rank, setup.world)
    except UnitCancelled:
        reply = Reply("cancelled")
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the node
        reply = Reply("failed", message=str(exc) or type(exc).__name__,
                      request_error=isinstance(exc, ValueError))
    return _combine(output, reply, setup)


def _combine(output: UnitOutput | None, reply: Reply | None, setup: WorkerSetup) -> Reply:
    """Agree on the unit's fate first (a small all-reduce), then sum the shares."""
    import torch
    import torch.distributed as dist

    device = setup.device if setup.backend == "nccl" else "cpu"
    # failed, cancelled, then one flag per rank: holds an output
    status = torch.zeros(2 + setup.world, dtype=torch.float64, device=device)
    if reply is not None:
        status[0 if reply.status == "failed" else 1] = 1
    elif output is not None:
        status[2 + setup.rank] = 1
    dist.all_reduce(status)
    failed, cancelled, holders = status[0].item(), status[1].item(), status[2:].nonzero()
    if failed or cancelled:
        return reply or Reply("cancelled" if not failed else "aborted")
    if len(holders) == 0:
        return Reply("failed", message="no share of the unit holds a sample",
                     request_error=True)
    layout = [[(n, v.shape, v.dtype) for n, v in output.update.items()]
              if output is not None else None]
    if len(holders) < setup.world:  # a share without a sample learns the tensors' shapes
        dist.broadcast_object_list(layout, src=int(holders[0]), device=torch.device(device))
    flat = dist_sums(output, layout[0], device)
    dist.all_reduce(flat)
    if setup.rank != 0:
        return Reply("done")
    return Reply("done", output=_shared_output(flat.cpu().numpy(), layout[0]))


SCALARS = 5  # samples, x loss, x error, x loss before, samples whose loss before was measured


def dist_sums(output: UnitOutput | None, layout: list, device: str) -> torch.Tensor:
    """One float64 vector: every tensor times the share's samples, then samples, samples
    x loss, samples x error, samples x loss before training and the samples that measured
    it (zeros for a share without a sample)."""
    import torch

    if output is None:
        size = sum(int(np.prod(shape)) for _, shape, _ in layout) + SCALARS
        return torch.zeros(size, dtype=torch.float64, device=device)
    n = output.num_samples
    parts = [np.asarray(output.update[name], np.float64).ravel() * n for name, _, _ in layout]
    before, measured = (0.0, 0) if output.loss_before is None else (output.loss_before, n)
    parts.append(np.array([n, n * output.loss, n * output.error, measured * before, measured],
                          np.float64))
    return torch.from_numpy(np.concatenate(parts)).to(device)


def _shared_output(flat: np.ndarray, layout: list) -> SharedOutput:
    """The mean update (sums over samples) in a new shared memory block, each tensor cast
    to its dtype, one tensor at a time: no second whole copy of the update is made."""
    total, loss, error, before, measured = flat[-SCALARS:]
    tensors, size = block_layout((name, dtype, shape) for name, shape, dtype in layout)
    block = SharedMemory(create=True, size=size)
    try:
        at = 0
        for _, dtype, shape, offset in tensors:
            count = int(np.prod(shape))
            target = np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=offset)
            target[...] = cast_like(flat[at:at + count].reshape(shape) / total, target.dtype)
            del target  # no view may outlive the mapping, which closes below
            at += count
    finally:
        block.close()
    return SharedOutput(block.name, tuple(tensors), int(round(total)), float(loss / total),
                        float(error / total),
                        float(before / measured) if measured else None)
