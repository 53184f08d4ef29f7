"""A local cluster for a notebook or a script: N compute nodes and a coordinator in their
own processes on 127.0.0.1, started with the same entry points as the console scripts,
on ports they choose and report, and ended by their PIDs when the block ends::

    with thrift_trainer.local_cluster(nodes=2) as cluster:
        result = cluster.train({"run": {"rounds": 3}})

Standard library only until a run is trained (api.py imports the client then).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from thrift_trainer.api import Coordinator, RoundInfo
    from thrift_trainer.results import TrainingResult

READY_SECONDS = 120.0  # a node imports torch at start: slow on a busy machine
STOP_SECONDS = 10.0  # from SIGTERM to SIGKILL
POLL_SECONDS = 0.05  # between looks at a port file while a process starts
# The console scripts' functions (thrift_trainer/commands.py), run as `python -c`, so that
# a clone and an installed trainer start the same way.
LAUNCH = "import sys; from thrift_trainer.commands import {0}; sys.exit({0}())"
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class ClusterError(RuntimeError):
    """A process of the local cluster did not start; the message ends with its log."""


class _Process:
    """One started process: its Popen, the log its output goes to and the port it bound."""

    def __init__(self, name: str, command: str, args: list[str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"
        self.port_file.unlink(missing_ok=True)
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, "-c", LAUNCH.format(command), *args,
             "--port-file", str(self.port_file)],
            cwd=workdir, env=_child_env(), stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT,
            # Ctrl-C in a terminal reaches the caller alone, which cancels its run first;
            # the processes are ended by stop(), after it.
            start_new_session=True)
        self.port = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, deadline: float) -> None:
        """Until the process has written its port; ClusterError when it exits or the
        deadline passes first."""
        while not self.port:
            text = self.port_file.read_text().strip() if self.port_file.exists() else ""
            if text.isdigit():
                self.port = int(text)
                return
            if self.popen.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with code {self.popen.returncode}"
                       if self.popen.poll() is not None else "did not report its port in time")
                raise ClusterError(f"{self.name} {why}; its log ({self.log_path}):\n"
                                   f"{self.log()[-4000:]}")
            time.sleep(POLL_SECONDS)  # the port file appears once the server listens

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        """SIGTERM to this process alone, by its PID: it stops its server and exits."""
        if self.popen.poll() is None:
            self.popen.terminate()

    def stop(self, deadline: float) -> None:
        """Wait for its exit until ``deadline``, then SIGKILL it (by its PID)."""
        try:
            try:
                self.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(STOP_SECONDS)
        finally:
            self._log.close()


def _child_env() -> dict[str, str]:
    """This environment, with the folder that holds this very thrift_trainer first on the
    import path, so that the children run the same trainer as the notebook."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    return env


class LocalCluster:
    """``nodes`` compute nodes and a coordinator on 127.0.0.1 (see the module's doc).

    ``plugins``: modules of your own (models, data sets) every process may import, found
    in ``plugin_dir`` (default: the current folder); ``data_root``: the folder of the data
    sets (default: the trainer's, as the commands have it); ``workdir``: where the
    processes' logs, the coordinator's run folders (``runs/``) and the saved models
    (``models/``) go (default: a new temporary folder, kept afterwards); ``policy``: the
    coordinator's scheduling policy (1 random, 2 load balancing, 3 adaptive);
    ``node_args`` / ``coordinator_args``: more flags of ``trainer-node`` /
    ``trainer-coordinator``.
    """

    def __init__(self, nodes: int = 2, *, plugins: Sequence[str] = (),
                 plugin_dir: str | os.PathLike | None = None,
                 data_root: str | os.PathLike | None = None,
                 workdir: str | os.PathLike | None = None, policy: int = 2,
                 node_args: Sequence[str] = (), coordinator_args: Sequence[str] = (),
                 ready_seconds: float = READY_SECONDS) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be a whole number of at least 1, got {nodes!r}")
        if isinstance(plugins, str):
            raise ValueError("plugins is a list of module names, e.g. ['my_models']")
        self.nodes = nodes
        self.plugins = list(plugins)
        self.plugin_dir = Path(plugin_dir or Path.cwd()).resolve()
        self.data_root = Path(data_root).resolve() if data_root is not None else None
        self.workdir = Path(workdir).resolve() if workdir is not None else None
        self.policy = policy
        self.node_args = list(node_args)
        self.coordinator_args = list(coordinator_args)
        self.ready_seconds = ready_seconds
        self.processes: list[_Process] = []
        self.coordinator_port = 0

    # ------------------------------------------------------------------ the processes
    def start(self) -> LocalCluster:
        """Start every process and wait until each listens; on any failure (Ctrl-C
        included) stop those already started and raise."""
        if self.processes:
            raise ClusterError("this local cluster is already started")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="thrift-trainer-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)  # a notebook that never leaves the block leaves none
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_all(self) -> None:
        deadline = time.monotonic() + self.ready_seconds
        shared = self._shared_args()
        nodes = [self._spawn(f"node{i}", "node",
                             ["0", "0", "--seed", str(i), *shared, *self.node_args])
                 for i in range(1, self.nodes + 1)]
        for node in nodes:
            node.wait_ready(deadline)
        nodes_file = self.workdir / "compute_nodes.txt"
        nodes_file.write_text("".join(f"127.0.0.1,{n.port}\n" for n in nodes))
        coordinator = self._spawn("coordinator", "coordinator", [
            "0", str(self.policy), "--nodes-file", str(nodes_file),
            "--run-dir", str(self.workdir / "runs"), *shared, *self.coordinator_args])
        coordinator.wait_ready(deadline)
        self.coordinator_port = coordinator.port

    def _shared_args(self) -> list[str]:
        args = ["--host", "127.0.0.1"]
        if self.data_root is not None:
            args += ["--data-root", str(self.data_root)]
        if self.plugins:
            args += ["--plugins", ",".join(self.plugins), "--plugin-dir", str(self.plugin_dir)]
        return args

    def _spawn(self, name: str, command: str, args: list[str]) -> _Process:
        process = _Process(name, command, args, self.workdir)
        self.processes.append(process)  # before it is ready: stop() ends it either way
        return process

    def stop(self) -> None:
        """End the coordinator, then the nodes, by their PIDs (safe to call twice)."""
        atexit.unregister(self.stop)
        processes, self.processes = self.processes, []
        for process in reversed(processes):  # the coordinator was started last
            process.terminate()
        deadline = time.monotonic() + STOP_SECONDS  # they stop at once, not one by one
        for process in reversed(processes):
            process.stop(deadline)

    @property
    def pids(self) -> list[int]:
        """The PIDs of the running cluster's processes, the coordinator's last."""
        return [p.pid for p in self.processes]

    def logs(self) -> str:
        """Every process's log, one after another."""
        return "\n".join(f"--- {p.log_path.name}\n{p.log()}" for p in self.processes)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ training
    def coordinator(self) -> Coordinator:
        """The cluster's coordinator as a `Coordinator` (api.py)."""
        from thrift_trainer.api import Coordinator

        if not self.coordinator_port:
            raise ClusterError("the local cluster is not started: use it in a with block "
                               "or call start()")
        return Coordinator("127.0.0.1", self.coordinator_port, plugins=self.plugins,
                           plugin_dir=self.plugin_dir)

    def train(self, config: dict[str, Any] | str | os.PathLike,
              on_round: Callable[[RoundInfo], None] | None = None,
              run_id: str | None = None, **options: Any) -> TrainingResult:
        """Train on this cluster (`Coordinator.train`); models are saved in
        ``workdir``/models unless ``out`` says otherwise."""
        options.setdefault("out", self.workdir / "models")
        return self.coordinator().train(config, on_round, run_id, **options)


def local_cluster(nodes: int = 2, **options: Any) -> LocalCluster:
    """A `LocalCluster` to use in a ``with`` block (its options are LocalCluster's)."""
    return LocalCluster(nodes, **options)
