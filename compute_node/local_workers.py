"""A node with local workers: `compute_node.py <port> <load_prob> --workers W`.

The node starts W worker processes once (compute_node/worker_process.py), a
torch.distributed group on this machine: gloo with `--device cpu`, NCCL with one GPU per
worker with `--device cuda`. `LocalWorkers` is the node's unit runner (the handler's
`unit_runner`): it splits each unit of an algorithm that can (`Algorithm.splits_units`)
into W shares, the workers compute them and all-reduce the sample-weighted sums, and the
node returns the one result a single worker would have made, up to float rounding for a
mean gradient (sync_sgd), as local averaging for local training (delta_avg, fl_gan).
Other algorithms (MD-GAN, whose sessions live in the node process) run in the node as
before. Load delay, cancel, heartbeats and fault injection stay the node's: they sit
around the runner.

The weights go to the workers through one shared memory block (one copy, whatever W);
each worker's pipe carries only the unit's description and its answer. A worker that
dies fails its unit (the coordinator gives it to a node again) and the node restarts
its group in the background; after `MAX_RESTARTS` failures with no unit done between
them, the node gives up: one line on stderr, and it stops with exit status 1.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np
from thrift.Thrift import TApplicationException

from thrift_trainer.compute_node.worker_process import (
    BATCHES,
    CANCEL,
    Reply,
    SharedOutput,
    ShareTask,
    WeightsLayout,
    WorkerSetup,
    block_layout,
    worker_main,
)
from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.cancel import UnitCancelled, UnitControl
from thrift_trainer.training.units import UnitJob, UnitOutput, Weights

log = logging.getLogger("compute_node")

START_SECONDS = 120.0  # for W workers to import torch and join their group
STOP_SECONDS = 5.0  # for a worker to leave when asked, before it is killed
POLL_SECONDS = 0.05  # how often a running unit's cancel flag and batches are passed on
MAX_RESTARTS = 3
SHM_FOLDER = Path("/dev/shm")  # where POSIX shared memory blocks are files (Linux)


class WorkerLost(TApplicationException):
    """A local worker died or its group broke: the unit fails, the group is restarted.
    A Thrift application error, so the coordinator's log shows why the unit failed."""

    def __init__(self, message: str) -> None:
        super().__init__(TApplicationException.INTERNAL_ERROR, message)


def check_workers(workers: int, device: str, relay: str | None = None) -> str | None:
    """Why a node cannot run `workers` local workers on `device`, or None."""
    if workers == 1:
        return None
    if relay is not None:
        return "--workers with --relay: a relay computes on its nodes, not on local workers"
    if device == "cpu":
        cores = os.cpu_count() or 1
        if workers > cores:
            return (f"--workers {workers}: this machine has {cores} CPU core(s); "
                    f"a node runs at most one worker per core")
        return None
    if device != "cuda":
        return (f"--workers {workers} with --device {device}: several workers take "
                f"--device cuda (worker r on cuda:r)")
    import torch

    gpus = torch.cuda.device_count()
    if workers > gpus:
        return (f"--workers {workers} with --device cuda: this machine has {gpus} GPU(s); "
                f"each worker needs its own")
    return None


class SharedWeights:
    """The node's shared memory block of weights, grown when a unit's weights need more."""

    def __init__(self) -> None:
        self._block: SharedMemory | None = None

    def write(self, weights: Weights) -> WeightsLayout:
        arrays = {name: np.asarray(value) for name, value in weights.items()}
        tensors, size = block_layout((name, a.dtype, a.shape) for name, a in arrays.items())
        block = self._room(size)
        for (name, dtype, shape, offset) in tensors:
            np.ndarray(shape, np.dtype(dtype), buffer=block.buf, offset=offset)[...] = \
                arrays[name]
        return WeightsLayout(block.name, tuple(tensors))

    def _room(self, size: int) -> SharedMemory:
        if self._block is None or self._block.size < size:
            self.close()
            self._block = SharedMemory(create=True, size=size)
        return self._block

    def close(self) -> None:
        if self._block is not None:
            self._block.close()
            self._block.unlink()
            self._block = None


class WorkerGroup:
    """W started worker processes, one pipe each, and their shared control array."""

    def __init__(self, workers: int, device: str, threads: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="node-workers-")
        self.backend = "nccl" if device.startswith("cuda") else "gloo"
        self.shared = context.RawArray("q", 1 + workers)
        self.pipes, self.procs = [], []
        for rank in range(workers):
            setup = WorkerSetup(rank, workers, self.backend, str(Path(self.folder) / "store"),
                                f"cuda:{rank}" if self.backend == "nccl" else "cpu", threads,
                                plugins.startup())
            mine, theirs = context.Pipe()
            proc = context.Process(target=worker_main, args=(setup, theirs, self.shared),
                                   name=f"node-worker-{rank}", daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(mine)
            self.procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_ready(self, seconds: float) -> None:
        """Until every worker has joined the group; WorkerLost if one dies or is late."""
        pending = set(self.pipes)
        deadline = threading.Event()
        timer = threading.Timer(seconds, deadline.set)
        timer.start()
        try:
            while pending and not deadline.is_set():
                ready = wait([*pending, *self._sentinels()], timeout=POLL_SECONDS * 4)
                self._check_alive(ready)
                for pipe in ready:
                    pending.discard(pipe)
                    pipe.recv()
        finally:
            timer.cancel()
        if pending:
            raise WorkerLost(f"local workers did not start within {seconds:g}s")

    def run(self, task: ShareTask, control: UnitControl) -> UnitOutput:
        """Every worker's share of the unit; their combined result (from rank 0)."""
        self.shared[CANCEL] = int(control.cancelled.is_set())  # cancelled while queued
        for rank in range(len(self.procs)):
            self.shared[BATCHES + rank] = 0
        for pipe in self.pipes:
            try:
                pipe.send(task)
            except OSError:  # a worker died since the last unit
                self._raise_lost()
        replies = self._collect(control)
        return _outcome(replies)

    def _collect(self, control: UnitControl) -> list[Reply]:
        pending = dict(zip(self.pipes, range(len(self.pipes)), strict=True))
        replies: list[Reply | None] = [None] * len(self.pipes)
        batches_before = control.batches
        while pending:
            ready = wait([*pending, *self._sentinels()], timeout=POLL_SECONDS)
            if control.cancelled.is_set():
                self.shared[CANCEL] = 1  # the workers stop before their next batch
            control.batches = batches_before + sum(self.shared[BATCHES:])
            self._check_alive(ready)
            for pipe in ready:
                try:
                    replies[pending.pop(pipe)] = pipe.recv()
                except EOFError:
                    self._raise_lost()
        return replies

    def _raise_lost(self) -> None:
        """WorkerLost for a pipe that broke: its worker is dead, or about to be."""
        self._check_alive(wait(self._sentinels(), timeout=STOP_SECONDS))
        raise WorkerLost("a local worker closed its pipe")

    def _sentinels(self) -> list[int]:
        return [p.sentinel for p in self.procs]

    def _check_alive(self, ready: list[Any]) -> None:
        """WorkerLost naming the first worker whose sentinel is among `ready`."""
        for rank, proc in enumerate(self.procs):
            if proc.sentinel in ready:
                proc.join()  # it has ended: this reaps it and reads its exit status
                raise WorkerLost(f"local worker {rank} (pid {proc.pid}) "
                                 f"{_death(proc.exitcode)}")

    def stop(self) -> None:
        """Ask every worker to leave, kill those that do not, and wait for all of them."""
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a dead worker's pipe
                pipe.send(None)
        for proc in self.procs:
            proc.join(STOP_SECONDS)
        self.kill()

    def kill(self) -> None:
        """Kill every worker still alive (by its PID), wait for each, free the group."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join()
        for pipe in self.pipes:
            pipe.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"


def _outcome(replies: list[Reply]) -> UnitOutput:
    """The unit's result, or the exception that its workers' replies call for."""
    for rank, reply in enumerate(replies):
        if reply.status == "failed":
            if reply.request_error:
                raise ValueError(reply.message)  # the handler answers InvalidRequest
            raise WorkerLost(f"local worker {rank} failed: {reply.message}")
    if any(reply.status == "cancelled" for reply in replies):
        raise UnitCancelled("unit cancelled")
    if replies[0].output is None:
        raise WorkerLost("local worker 0 sent no result")
    return mapped_output(replies[0].output)


def mapped_output(output: SharedOutput) -> UnitOutput:
    """The output rank 0 left in shared memory, as read-only views of that block: the block
    is unlinked at once and unmapped when the last view goes (after the reply is sent)."""
    path = SHM_FOLDER / output.block
    fd = os.open(path, os.O_RDONLY)
    try:
        memory = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
        path.unlink()
        # rank 0 created it, so this process's resource tracker knows the name: forget it
        resource_tracker.unregister(f"/{output.block}", "shared_memory")
    update = {}
    for name, dtype, shape, offset in output.tensors:
        update[name] = np.ndarray(shape, np.dtype(dtype), buffer=memory, offset=offset)
    return UnitOutput(update=update, num_samples=output.num_samples, loss=output.loss,
                      error=output.error, loss_before=output.loss_before)


class LocalWorkers:
    """The node's unit runner with W local workers; see the module docstring."""

    def __init__(self, workers: int, device: str, threads: int,
                 inner: Callable[[type[Algorithm], UnitJob, Path], UnitOutput],
                 on_fatal: Callable[[str], None] | None = None,
                 max_restarts: int = MAX_RESTARTS) -> None:
        self.workers, self.device, self.threads = workers, device, threads
        self.inner = inner  # runs the units of algorithms that do not split them
        self.on_fatal = on_fatal or _stop_node
        self.max_restarts = max_restarts
        self.fatal: str | None = None  # why the node gave its workers up
        self._group: WorkerGroup | None = None
        self._ready = threading.Event()  # set when a group is ready, or given up
        self._failures = 0  # group failures since a unit last completed
        self._lock = threading.Lock()
        self._weights = SharedWeights()
        self._closed = False

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def start(self) -> None:
        """Start the group and wait until it is ready; WorkerLost if it cannot start."""
        group = WorkerGroup(self.workers, self.device, self.threads)
        try:
            group.wait_ready(START_SECONDS)
        except WorkerLost:
            group.kill()
            raise
        self._installed(group)

    def describe(self) -> str:
        pids = ", ".join(str(pid) for pid in self._group.pids) if self._group else "none"
        return f"{self.workers} workers ({self.backend}, pids {pids})"

    def __call__(self, algorithm: type[Algorithm], job: UnitJob, data_dir: Path) -> UnitOutput:
        if not algorithm.splits_units or job.share is not None or job.unit.evaluates:
            # a relay's share, or a federated evaluation (nothing to average): computed
            return self.inner(algorithm, job, data_dir)  # whole, by the node
        group = self._ready_group(job.control)
        task = ShareTask(job.algorithm or algorithm.name, job.run_id, job.round, job.unit,
                         job.model, job.config, self._weights.write(job.weights), str(data_dir),
                         job.dataset, job.checked_config)
        try:
            output = group.run(task, job.control)
        except (WorkerLost, OSError) as exc:
            self._lost(group, str(exc))
            raise WorkerLost(f"{exc}; the unit failed and the node restarts its "
                             f"workers") from None
        with self._lock:
            self._failures = 0
        return output

    def close(self) -> None:
        """Stop the workers (asked first, then killed) and free the shared memory."""
        with self._lock:
            self._closed, group, self._group = True, self._group, None
            self._ready.set()
        if group is not None:
            group.stop()
        self._weights.close()

    # ------------------------------------------------------------------ restarts
    def _ready_group(self, control: UnitControl) -> WorkerGroup:
        """The group, once it is ready; a unit cancelled meanwhile stops waiting."""
        deadline = time.monotonic() + START_SECONDS
        while not self._ready.wait(POLL_SECONDS):
            if control.cancelled.is_set():
                raise UnitCancelled("cancelled while the local workers restarted")
            if time.monotonic() > deadline:
                raise WorkerLost("the node's local workers are still restarting")
        with self._lock:
            group = self._group
        if group is None:
            raise WorkerLost(self.fatal or "the node's local workers are stopped")
        return group

    def _installed(self, group: WorkerGroup) -> None:
        with self._lock:
            if self._closed:
                group.stop()
                return
            self._group = group
            self._ready.set()
        log.info("local workers ready: %s", self.describe())

    def _lost(self, group: WorkerGroup, reason: str) -> None:
        """Kill a broken group and start another in the background, or give up."""
        with self._lock:
            if self._group is group:
                self._group = None
                self._ready.clear()
            self._failures += 1
            failures, closed = self._failures, self._closed
        group.kill()
        if closed:
            return
        if failures > self.max_restarts:
            self._give_up(f"local workers failed {failures} times in a row, "
                          f"last: {reason}")
            return
        log.warning("local workers failed (%s); restarting them (%d of at most %d)",
                    reason, failures, self.max_restarts)
        threading.Thread(target=self._restart, name="restart-workers", daemon=True).start()

    def _restart(self) -> None:
        group = WorkerGroup(self.workers, self.device, self.threads)
        try:
            group.wait_ready(START_SECONDS)
        except WorkerLost as exc:
            self._lost(group, str(exc))
            return
        self._installed(group)

    def _give_up(self, message: str) -> None:
        with self._lock:
            self.fatal = message
            self._ready.set()  # units waiting for a group fail at once
        log.error("%s; the node stops", message)
        self.on_fatal(message)


def _stop_node(message: str) -> None:
    """Stop the node as SIGTERM would (its graceful shutdown), after one clear line."""
    print(f"error: {message}; the node stops", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def attach(handler: Any, workers: int, device: str) -> LocalWorkers | None:
    """Start `workers` local workers and make them `handler`'s unit runner (None, and
    nothing changed, for one worker); WorkerLost if they cannot start."""
    if workers == 1:
        return None
    threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)  # the node's, per worker
    runner = LocalWorkers(workers, device, threads, inner=handler.unit_runner)
    runner.start()
    atexit.register(runner.close)  # no worker outlives the node, however main ends
    handler.unit_runner = runner
    return runner


def exit_status(runner: LocalWorkers | None, status: int) -> int:
    """Stop the workers; the node's exit status: 1 when it gave its workers up."""
    if runner is None:
        return status
    runner.close()
    return 1 if runner.fatal else status
