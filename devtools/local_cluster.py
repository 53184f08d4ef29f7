"""Real compute-node, coordinator and client processes on this machine.

Used by the tests, the benchmarks and the demo: start a process, learn its port from
the line it prints, wait for lines of its output, and end it by its PID.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.warm_starts import WarmStarter, capture

REPO = Path(__file__).resolve().parent.parent
READY_SECONDS = 30.0
LISTENING = re.compile(r"listening on \S+:(\d+)")
PULLING = re.compile(r"pulling from \S+:(\d+)")  # a pull node's port is its coordinator's


@dataclass
class Proc:
    """A started process; `port` is read from the port file it writes once listening."""

    popen: subprocess.Popen
    log_path: Path
    port: int = 0
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """Block until a line of output matches `pattern`; AssertionError after `timeout`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if match := regex.search(line):
                        return match
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (not self.alive() and seen == len(self.lines)):
                    raise AssertionError(f"no line matching {pattern!r}:\n{self.log()}")
                self.changed.wait(min(remaining, 0.5))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate, wait, then kill: only this process, by its PID."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


# Set by the tests (tests/conftest.py): the trainer's scripts are forked by a starter that
# has their libraries loaded (devtools/warm_starts.py), one per process that asks, made on
# first use; False: each starts in a fresh interpreter.
warm_starts = False
_warm_starter: WarmStarter | None = None
_warm_starter_made = threading.Lock()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start(script: str, args: list[str], workdir: Path, name: str,
          ready: re.Pattern = LISTENING, env: dict[str, str] | None = None) -> Proc:
    """Start `python <script> <args>` and wait until it prints the port it listens on."""
    return start_command([sys.executable, str(REPO / script), *args], workdir, name, ready,
                         env=env)


def start_command(command: list[str], workdir: Path, name: str,
                  ready: re.Pattern = LISTENING, env: dict[str, str] | None = None,
                  ready_seconds: float = READY_SECONDS) -> Proc:
    """Start ``command`` (e.g. an installed console script) in ``workdir`` and wait until it
    prints the port it listens on."""
    log_path = workdir / f"{name}.log"
    env = python_env() if env is None else env
    if _warm_startable(command):
        popen = _starter().start(command, workdir, env)
    else:
        popen = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
    proc = Proc(popen, log_path)
    threading.Thread(target=_copy_output, args=(proc, ready_event := threading.Event(), ready),
                     daemon=True).start()
    deadline = time.monotonic() + ready_seconds
    while not ready_event.wait(0.05):
        if not proc.alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not start (exit {popen.returncode}):\n{proc.log()}")
    return proc


def _copy_output(proc: Proc, ready: threading.Event, ready_line: re.Pattern) -> None:
    """Copy the child's output to its log file; note the port from its 'listening' line."""
    with open(proc.log_path, "wb") as log:
        for raw in proc.popen.stdout:
            log.write(raw)
            log.flush()
            line = raw.decode(errors="replace")
            with proc.changed:
                proc.lines.append(line)
                proc.changed.notify_all()
            match = ready_line.search(line)
            if match and not ready.is_set():
                proc.port = int(match.group(1))
                ready.set()


def start_node(workdir: Path, name: str, load: float = 0.0, *extra: str) -> Proc:
    return start("compute_node.py", ["0", str(load), "--host", "127.0.0.1", *extra],
                 workdir, name)


def start_pull_node(workdir: Path, name: str, coordinator_port: int, load: float = 0.0,
                    *extra: str) -> Proc:
    """A node in pull mode: it dials the coordinator on 127.0.0.1 and leases units."""
    return start("compute_node.py", ["--pull", f"127.0.0.1:{coordinator_port}", str(load),
                                     "--node-id", name, *extra], workdir, name, ready=PULLING)


def write_nodes_file(path: Path, nodes: list[Proc]) -> Path:
    path.write_text("".join(f"127.0.0.1,{n.port}\n" for n in nodes))
    return path


def start_coordinator(workdir: Path, nodes_file: Path, policy: int = 2, *extra: str,
                      run_dir: Path | None = None, name: str = "coordinator",
                      env: dict[str, str] | None = None) -> Proc:
    """A coordinator keeping its runs in ``run_dir`` (default: ``workdir``/runs); ``name``
    names its log (several coordinators: a leader and its standbys); ``env``: its
    environment (default python_env())."""
    runs = run_dir if run_dir is not None else workdir / "runs"
    return start("coordinator_node.py",
                 ["0", str(policy), "--host", "127.0.0.1", "--nodes-file", str(nodes_file),
                  "--run-dir", str(runs), *extra], workdir, name, env=env)


def run_client(args: list[str], workdir: Path, timeout: float = 120.0
               ) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "client.py"), *args]
    if not _warm_startable(command):
        return subprocess.run(command, cwd=workdir, env=python_env(), capture_output=True,
                              text=True, timeout=timeout)
    out, err, code = capture(_starter().start(command, workdir, python_env(),
                                              stderr_apart=True), timeout)
    return subprocess.CompletedProcess(command, code, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def _warm_startable(command: list[str]) -> bool:
    """Whether warm starts are wanted and ``command`` is a script run by this interpreter
    (an installed console script, or another Python, starts fresh)."""
    return (warm_starts and len(command) > 1 and command[0] == sys.executable
            and command[1].endswith(".py"))


def _starter() -> WarmStarter:
    global _warm_starter
    with _warm_starter_made:
        if _warm_starter is None:
            _warm_starter = WarmStarter(python_env())
        return _warm_starter
