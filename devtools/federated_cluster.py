"""Shared pieces of the federated-clients benchmarks (bench/fedavg_paper.py,
bench/clients_scale.py).

A coordinator and compute nodes on 127.0.0.1 where each node holds its own share of the
clients (``--clients``), a run followed through its run folder's ``metrics.jsonl`` (and
cancelled once it has what it needs), and what /proc says of a process: its CPU seconds
(utime + stime) and its peak resident memory (VmHWM). Every process is ended by its PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import local_cluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def client_ranges(count: int, nodes: int) -> list[str]:
    """``--clients`` values that deal ``count`` clients to ``nodes`` nodes in consecutive
    ranges of equal size (within one): 100 over 2 gives ["0-49", "50-99"]."""
    if nodes < 1 or count < nodes:
        raise ValueError(f"{count} clients cannot be dealt to {nodes} nodes")
    bounds = [count * k // nodes for k in range(nodes + 1)]
    return [f"{low}-{high - 1}" for low, high in zip(bounds, bounds[1:], strict=False)]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


def memory_kib(pid: int, key: str = "VmHWM") -> int:
    """A /proc/<pid>/status figure in KiB: VmHWM (peak resident set) by default."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def with_sets(sets: Sequence[str]) -> list[str]:
    """["a.b=1", ...] as the client's arguments: ["--set", "a.b=1", ...]."""
    return [part for item in sets for part in ("--set", item)]


@dataclass
class FollowedRun:
    """A run the client finished or that was cancelled once it had what it needed: its
    metrics rows, the client's exit status and output, the coordinator's CPU seconds and
    the times (monotonic) taken when the client started, round 1 ended and it ended, and
    the client process's own peak resident memory in KiB."""

    run_dir: Path
    rows: list[dict[str, Any]]
    returncode: int
    stdout: str
    stderr: str
    cancelled: bool
    cpu: dict[str, float] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    client_peak_kib: int = 0


class FederatedCluster:
    """``nodes`` compute nodes each started with its ``--clients`` range of ``count``
    clients (none: every node holds every client), and a coordinator over them."""

    def __init__(self, workdir: Path, count: int | None, nodes: int = 2,
                 coordinator_args: Sequence[str] = ("--no-speculation",),
                 node_args: Sequence[str] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.nodes: list[local_cluster.Proc] = []
        self.coordinator: local_cluster.Proc | None = None
        ranges = client_ranges(count, nodes) if count else [None] * nodes
        try:
            for k, held in enumerate(ranges):
                extra = ["--seed", str(k + 1), *node_args]
                if held is not None:
                    extra += ["--clients", held]
                self.nodes.append(local_cluster.start_node(workdir, f"node{k + 1}", 0.0,
                                                           *extra))
            nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", self.nodes)
            self.coordinator = local_cluster.start_coordinator(workdir, nodes_file, 2,
                                                               *coordinator_args)
        except BaseException:
            self.stop()
            raise

    @property
    def processes(self) -> dict[str, local_cluster.Proc]:
        named = {"coordinator": self.coordinator} if self.coordinator is not None else {}
        return named | {f"node{k + 1}": node for k, node in enumerate(self.nodes)}

    def runs(self) -> set[str]:
        folder = self.workdir / "runs"
        return {p.name for p in folder.iterdir()} if folder.is_dir() else set()

    def follow(self, sets: Sequence[str], stop: Callable[[list[dict[str, Any]]], bool]
               = lambda rows: False, timeout: float = 3600.0, poll: float = 0.02
               ) -> FollowedRun:
        """Train with the client's ``--set`` items, reading the run folder's metrics rows
        as they come; once ``stop(rows)`` is true the run is cancelled (client.py cancel).
        The coordinator's CPU seconds are taken before the client starts
        (``cpu["start"]``), when the first round's row appears (``cpu["round1"]``) and
        after the client has ended (``cpu["end"]``)."""
        assert self.coordinator is not None
        before = self.runs()
        pid = self.coordinator.popen.pid
        cpu = {"start": cpu_seconds(pid)}
        times = {"start": time.monotonic()}
        out_path, err_path = self.workdir / "client.out", self.workdir / "client.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            client = subprocess.Popen(
                [sys.executable, str(local_cluster.REPO / "client.py"), "127.0.0.1",
                 str(self.coordinator.port), *with_sets(sets), "--json", "--quiet"],
                cwd=local_cluster.REPO, env=local_cluster.python_env(), stdout=out,
                stderr=err)
        run_dir: Path | None = None
        rows: list[dict[str, Any]] = []
        cancelled = False
        deadline = time.monotonic() + timeout
        status = rusage = None
        try:
            while True:
                done_pid, status, rusage = os.wait4(client.pid, os.WNOHANG)
                if done_pid:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the run did not end in {timeout:.0f} s")
                if run_dir is None:
                    new = self.runs() - before
                    run_dir = self.workdir / "runs" / new.pop() if new else None
                if run_dir is not None:
                    fresh = _rows(run_dir / "metrics.jsonl", len(rows))
                    if fresh and not rows:
                        cpu["round1"], times["round1"] = cpu_seconds(pid), time.monotonic()
                    rows += fresh
                    if fresh and not cancelled and stop(rows):
                        local_cluster.run_client(["cancel", "127.0.0.1",
                                                  str(self.coordinator.port), run_dir.name],
                                                 local_cluster.REPO, timeout=60)
                        cancelled = True
                time.sleep(poll)
        finally:
            if status is None and client.poll() is None:
                client.kill()
                client.wait(10)
        client.returncode = os.waitstatus_to_exitcode(status)
        cpu["end"], times["end"] = cpu_seconds(pid), time.monotonic()
        if run_dir is None:
            new = self.runs() - before
            run_dir = self.workdir / "runs" / new.pop() if new else self.workdir / "runs"
        rows += _rows(run_dir / "metrics.jsonl", len(rows))
        return FollowedRun(run_dir, rows, client.returncode, out_path.read_text(),
                           err_path.read_text(), cancelled, cpu, times,
                           client_peak_kib=rusage.ru_maxrss)

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{proc.log()}" for name, proc in self.processes.items())

    def stop(self) -> None:
        """End the coordinator, then each node, by its PID."""
        for proc in [self.coordinator, *self.nodes]:
            if proc is not None:
                proc.stop()

    def __enter__(self) -> FederatedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _rows(path: Path, seen: int) -> list[dict[str, Any]]:
    """The complete lines of a metrics.jsonl after the first ``seen`` (a line still being
    written is left for the next read)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # only lines ended by a newline
    return [json.loads(line) for line in lines[seen:] if line.strip()]
