"""Shared pieces of the throughput benchmarks (bench/*_throughput.py).

A path's steady-state measurement (`PathResult`), the index ranges a worker takes as
sync_sgd's units walk the training part (`unit_ranges`), torch DistributedDataParallel
ranks spawned on this machine (`spawn_ranks`) and their timed steady state
(`timed_ddp_steps`), a training run through real node,
coordinator and client processes with the times its coordinator logged for each round
(`train_on_cluster`, `round_times`), and the same memory allocator settings for every
process of a comparison (`keep_freed_memory`). Every process is ended by its PID.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from devtools import local_cluster

ROUND_LINE = re.compile(r"^(\S+ \S+) coordinator INFO round (\d+)/\d+: validation error")
UNIT_LINE = re.compile(r"node INFO unit \S+ round (\d+) done: \d+ samples in ([\d.]+)s")
RANK_JOIN_SECONDS = 600
# glibc malloc: blocks up to 32 MiB from the heap, and freed memory kept in it (not
# returned to the system until 1 GiB lies free at its top).
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 * 2**20, 2**30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers


@dataclass
class PathResult:
    """One path's steady state: ``updates`` of ``global_batch`` samples in ``seconds``."""

    label: str
    workers: int
    global_batch: int
    updates: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        """Samples (images, tokens, ...) per second."""
        return self.global_batch * self.updates / self.seconds

    @property
    def updates_per_second(self) -> float:
        return self.updates / self.seconds


def unit_ranges(total: int, unit: int, first: int, stride: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of ``unit`` samples for one worker (every ``stride``-th one,
    from the ``first``), wrapping at the end of the data set like sync_sgd's units."""
    per_epoch = math.ceil(total / unit)
    number = first
    while True:
        start = number % per_epoch * unit
        yield start, min(start + unit, total)
        number += stride


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker: Callable[..., None], world: int, *args: Any) -> None:
    """``worker(rank, world, port, *args)`` in ``world`` spawned processes that meet on a
    free port of 127.0.0.1 (gloo's ``tcp://`` rendezvous); returns when every rank has
    ended, and terminates, by its PID, any rank still alive when it fails. A worker ends with
    ``dist.barrier()`` before ``dist.destroy_process_group()``, so that no rank tears its
    gloo group down while another still works (rank 0 scoring the model, say). Known:
    with torch 2.13 on the 2-core VM, a gloo rank sometimes aborts mid-run ("terminate
    called without an active exception", SIGABRT; about one full CNN bench in four, never
    when the DDP path runs alone); the bench then fails with that error and is run again."""
    import torch.multiprocessing as mp  # only the benchmarks that run DDP import torch here

    # The ranks' links to each other on loopback too, not on whatever interface the host
    # name resolves to: benchmarks talk to 127.0.0.0/8 only.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    ctx = mp.start_processes(worker, args=(world, free_port(), *args), nprocs=world,
                             join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=RANK_JOIN_SECONDS):
            pass
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)


def timed_ddp_steps(step: Callable[[], None], seconds: float, out: str | Path,
                    warmup: int = 3) -> None:
    """A DDP rank's steady state: ``warmup`` steps, ``warmup`` more to measure the pace,
    then as many steps as fill about ``seconds`` (rank 0's count, broadcast so that every
    rank takes the same), timed between barriers. Rank 0 writes {"steps", "seconds"} as
    JSON to ``out``; then every rank waits for the others (see `spawn_ranks`)."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        step()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(warmup):
        step()
    pace = (time.perf_counter() - began) / warmup
    steps = torch.tensor([max(1, int(seconds / pace))])
    dist.broadcast(steps, src=0)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(int(steps)):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - began
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"steps": int(steps), "seconds": elapsed}))
    dist.barrier()


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse, in this process (mallopt) and
    in every process started from it afterwards (its environment). With the defaults, the
    large tensors of a torch step go back to the system when freed and come back as fresh
    pages, page fault after page fault, as often as each process's allocation history
    makes its thresholds say: two processes running the same maths then differ by 10-15 %
    on a CNN. False where the C library is not glibc (nothing is changed)."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    os.environ.update(MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
                      MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD))
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def round_times(log: str) -> dict[int, float]:
    """When the coordinator logged the end of each round (its log's asctime, in seconds)."""
    ends = {}
    for line in log.splitlines():
        if match := ROUND_LINE.match(line):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            ends[int(match.group(2))] = stamp.timestamp()
    return ends


@dataclass
class ClusterRun:
    """What a run through real processes left: the client's ``--json`` result and the
    logs of the coordinator and of each node."""

    result: dict[str, Any]
    coordinator_log: str
    node_logs: list[str]

    def round_ends(self) -> dict[int, float]:
        return round_times(self.coordinator_log)

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of the run folder's metrics.jsonl (one a round, with its phases)."""
        path = Path(self.result["coordinator_run_dir"]) / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def unit_seconds(self, first_round: int = 2) -> list[float]:
        """The seconds each node's log gives its units, from round ``first_round`` on."""
        return [seconds for round_index, found in self.unit_seconds_by_round().items()
                if round_index >= first_round for seconds in found]

    def unit_seconds_by_round(self) -> dict[int, list[float]]:
        """Round -> the seconds the nodes' logs give that round's units."""
        found: dict[int, list[float]] = {}
        for log in self.node_logs:
            for match in UNIT_LINE.finditer(log):
                found.setdefault(int(match.group(1)), []).append(float(match.group(2)))
        return found


class LocalCluster:
    """Compute nodes (load 0) and a coordinator on 127.0.0.1, both logging at INFO (their
    round and unit lines), that serve one run after another (`train`)."""

    def __init__(self, nodes: int, workdir: Path, node_args: Sequence[str] = (),
                 coordinator_args: Sequence[str] = (), policy: int = 2) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[local_cluster.Proc] = []
        try:
            for i in range(nodes):
                self.procs.append(local_cluster.start_node(
                    workdir, f"node{i}", 0.0, "--log-level", "INFO", *node_args))
            nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", self.procs)
            self.coordinator = local_cluster.start_coordinator(
                workdir, nodes_file, policy, "--log-level", "INFO", *coordinator_args)
        except BaseException:
            self.stop()
            raise
        self.nodes = list(self.procs)
        self.procs.append(self.coordinator)

    def train(self, client_args: Sequence[str], timeout: float = 900.0) -> ClusterRun:
        """The client with ``client_args`` after the coordinator's address and with
        ``--json --quiet``, run from the repository (so ``--config`` paths are the
        repository's); the logs the processes wrote meanwhile. RuntimeError with the
        client's error and the coordinator's log when the run fails."""
        seen = [len(proc.lines) for proc in self.procs]
        done = local_cluster.run_client(["127.0.0.1", str(self.coordinator.port),
                                         *client_args, "--json", "--quiet"],
                                        local_cluster.REPO, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{len(self.nodes)}-node run failed: {done.stderr}\n"
                               f"{self.coordinator.log()}")
        result = json.loads(done.stdout)
        # The coordinator logs this before it answers; its output may still be on its way.
        self.coordinator.wait_for(rf"run {re.escape(result['run_id'])} finished")
        logs = ["".join(proc.lines[first:]) for proc, first in zip(self.procs, seen,
                                                                    strict=True)]
        return ClusterRun(result, logs[-1], logs[:-1])

    def stop(self) -> None:
        """End every process, the coordinator first, each by its PID."""
        for proc in reversed(self.procs):
            proc.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def train_on_cluster(nodes: int, client_args: Sequence[str], workdir: Path, *,
                     node_args: Sequence[str] = (), coordinator_args: Sequence[str] = (),
                     policy: int = 2, timeout: float = 900.0) -> ClusterRun:
    """One run on a `LocalCluster` of its own, started for it and ended after it."""
    with LocalCluster(nodes, workdir, node_args, coordinator_args, policy) as cluster:
        return cluster.train(client_args, timeout)
