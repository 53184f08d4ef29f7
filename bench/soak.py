"""Soak: dozens of compute nodes, one coordinator, hundreds of rounds, nodes dying.

Node servers run in groups (`devtools.node_group`: several nodes per process, each on
its own port) on 127.0.0.1, plus some groups of one. While the client trains, a killer
thread SIGKILLs a random group every few seconds (all its nodes die at once, calls in
flight included) and starts it again on the same ports after a short downtime; the
coordinator keeps listing those addresses in its nodes file. The model is the letters
MLP (`delta_avg`, numpy only) made tiny, on a derived data set of many small unit files,
so rounds are short and the coordinator's own overheads dominate.

The coordinator's CPU time, RSS, threads and open files are sampled from /proc every
second. Afterwards its run store (SQLite, or PostgreSQL with --store-url) is audited:
every unit of every round must be completed or discarded with a reason, with no unit
pending or in progress, no attempt left open, and counts that add up. The exit status is
1 when the audit or the run fails.

    python bench/soak.py --quick                      # 8 nodes, 40 rounds, under a minute
    python bench/soak.py --nodes 48 --rounds 1000 --kill-every 2 --seed 1 \\
        --plot docs/images/soak.png
    SOAK_TIMERS=/tmp/cpu.txt python bench/soak.py --rounds 100   # where the CPU goes

Where the coordinator's CPU goes: SOAK_TIMERS=FILE runs it under bench/profiled.py's
timers (thread CPU and context switches per engine function), SOAK_PROFILE=FILE under
cProfile (call counts; its times are inflated), each written to FILE when the coordinator
exits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.ledger_audit import Ledger, RunShape  # noqa: E402
from devtools.ledger_audit import audit as audit_store  # noqa: E402
from devtools.machine import cpu_model  # noqa: E402

DATASET = "soak"
READY_SECONDS = 30.0  # a process must be listening within this
STOP_SECONDS = 15.0  # graceful stop, then SIGKILL
TICK_SECONDS = 0.1  # the killer's step
MAX_RESTART_TRIES = 5
PORT_BASE_LOW = 10_000  # fixed ports are picked below the ephemeral range
DEFAULT_TIMEOUT = "120 + 3 s per round"
PROFILE_ENV = "SOAK_PROFILE"  # a file: profile the coordinator into it (bench/profiled.py)
TIMERS_ENV = "SOAK_TIMERS"  # a file: the coordinator's CPU per engine function, into it


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Settings:
    nodes: int
    rounds: int
    units: int  # per round; one small file each
    rows: int  # per unit file
    group_size: int
    singles: int  # groups of one node
    kill_every: float
    down: float
    max_down: float  # fraction of the nodes that may be down at once
    load: float
    load_delay: float
    policy: int
    hidden: int
    epochs: int
    seed: int
    timeout: float
    client_poll: float  # seconds between the client's status calls
    mode: str = "sync"  # schedule.mode of the run
    buffer_size: int = 3  # schedule.buffer_size of a buffered run
    store_url: str | None = None  # a PostgreSQL run store instead of SQLite in the workdir

    @property
    def results_per_round(self) -> int:
        """Results a round takes: its units (sync, async), or whole buffers of them."""
        if self.mode != "buffered":
            return self.units
        return -(-self.units // self.buffer_size) * self.buffer_size


def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python bench/soak.py --nodes 48 --rounds 300 --kill-every 3 --seed 1")
    add = parser.add_argument
    add("--quick", action="store_true",
        help="8 nodes, 40 rounds, a kill every 0.5 s: under a minute (other options still apply)")
    add("--nodes", type=int, default=None, help="compute nodes (default 48; quick 8)")
    add("--rounds", type=int, default=None, help="training rounds (default 300; quick 40)")
    add("--units", type=int, default=None, help="work units per round (default: --nodes)")
    add("--rows", type=int, default=40, help="letters rows per unit file (default 40)")
    add("--group-size", type=int, default=None,
        help="nodes per multi-node group process (default 8; quick 3)")
    add("--singles", type=int, default=None,
        help="nodes that run as groups of one (default 8; quick 2)")
    add("--kill-every", type=float, default=None, metavar="SECONDS",
        help="mean time between kills, jittered 0.5-1.5x (default 3; quick 0.5)")
    add("--down", type=float, default=None, metavar="SECONDS",
        help="mean downtime of a killed group, jittered 0.5-1.5x (default 2; quick 0.5)")
    add("--max-down", type=float, default=0.5,
        help="largest fraction of the nodes down at once (default 0.5)")
    add("--load", type=float, default=0.05, help="load probability of every node (default 0.05)")
    add("--load-delay", type=float, default=0.1, help="simulated load delay, s (default 0.1)")
    add("--policy", type=int, default=2, choices=[1, 2, 3], help="scheduling policy (default 2)")
    add("--hidden", type=int, default=8, help="hidden units of the MLP (default 8)")
    add("--epochs", type=int, default=1, help="local epochs per unit (default 1)")
    add("--seed", type=int, default=1, help="seed of kills, loads, scheduling and model")
    add("--mode", default="sync", choices=["sync", "async", "buffered"],
        help="schedule.mode of the run (default sync)")
    add("--buffer-size", type=int, default=3, help="schedule.buffer_size in buffered mode "
                                                   "(default 3)")
    add("--client-poll", type=float, default=0.5, metavar="SECONDS",
        help="the client's progress refresh: one status call this often (default 0.5, the "
             "client's own default)")
    add("--timeout", type=float, default=None, metavar="SECONDS",
        help=f"give up after this long (default {DEFAULT_TIMEOUT})")
    add("--workdir", default=None, help="keep logs, data and the run store here (default: a "
                                        "temporary folder, removed at the end)")
    add("--store-url", default=None, metavar="URL",
        help="the coordinator's run store: this PostgreSQL database (postgresql://...) "
             "instead of SQLite in the work folder; the audit reads it there")
    add("--json", default=None, metavar="PATH", help="write every figure and sample here")
    add("--plot", default=None, metavar="PATH",
        help="draw units/s, the coordinator's CPU and RSS and the load average to this PNG")
    args = parser.parse_args(argv)
    quick = args.quick
    nodes = args.nodes or (8 if quick else 48)
    rounds = args.rounds or (40 if quick else 300)
    settings = Settings(
        nodes=nodes, rounds=rounds, units=args.units or nodes, rows=args.rows,
        group_size=args.group_size or (3 if quick else 8),
        singles=args.singles if args.singles is not None else (2 if quick else 8),
        kill_every=args.kill_every or (0.5 if quick else 3.0),
        down=args.down or (0.5 if quick else 2.0), max_down=args.max_down, load=args.load,
        load_delay=args.load_delay, policy=args.policy, hidden=args.hidden, epochs=args.epochs,
        seed=args.seed, timeout=args.timeout or 120.0 + 3.0 * rounds,
        client_poll=args.client_poll, mode=args.mode, buffer_size=args.buffer_size,
        store_url=args.store_url)
    problem = check_settings(settings)
    if problem:
        parser.error(problem)
    return settings, args


def check_settings(s: Settings) -> str | None:
    """Why these settings cannot run, or None."""
    if not 2 <= s.nodes <= 256:
        return "--nodes must be 2..256"
    if s.rounds < 1 or s.units < 1 or s.rows < 1 or s.epochs < 1 or s.hidden < 1:
        return "--rounds, --units, --rows, --epochs and --hidden must be at least 1"
    if s.group_size < 1 or not 0 <= s.singles <= s.nodes:
        return "--group-size must be at least 1 and --singles 0..--nodes"
    if s.kill_every <= 0 or s.down <= 0 or not 0 < s.max_down < 1:
        return "--kill-every and --down must be positive, --max-down in (0, 1)"
    if not 0 <= s.load <= 1 or s.load_delay < 0:
        return "--load must be in 0..1, --load-delay at least 0"
    if s.client_poll <= 0:
        return "--client-poll must be positive"
    return None


def group_sizes(s: Settings) -> list[int]:
    """`singles` groups of one, the rest in groups of `group_size` (the last may be smaller)."""
    rest = s.nodes - s.singles
    sizes = [min(s.group_size, rest - i) for i in range(0, rest, s.group_size)]
    return sizes + [1] * s.singles


# ---------------------------------------------------------------- data set
def make_dataset(root: Path, units: int, rows: int, validate_rows: int = 400) -> Path:
    """Many small unit files cut from the letters training shards (reused in turn when
    more rows are needed), and a small validation file, so evaluation stays cheap."""
    source = REPO / "data" / "letters"
    train = [line for f in sorted(source.glob("train_*"))
             for line in f.read_text().splitlines() if line.strip()]
    folder = root / DATASET
    folder.mkdir(parents=True)
    for u in range(units):
        chunk = [train[(u * rows + r) % len(train)] for r in range(rows)]
        (folder / f"train_u{u + 1:04d}.txt").write_text("\n".join(chunk) + "\n")
    validate = (source / "validate_letters.txt").read_text().splitlines()[:validate_rows]
    (folder / "validate_soak.txt").write_text("\n".join(validate) + "\n")
    return root


def pick_ports(count: int, rng: random.Random) -> list[int]:
    """`count` consecutive free ports below the ephemeral range: a port left by a killed
    group must not be handed to some other program's outgoing connection meanwhile."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low - count - 1 <= PORT_BASE_LOW:
        raise RuntimeError(f"no room for {count} fixed ports below the ephemeral range ({low})")
    for _ in range(100):
        base = rng.randrange(PORT_BASE_LOW, low - count)
        if all(_port_free(p) for p in range(base, base + count)):
            return list(range(base, base + count))
    raise RuntimeError(f"found no {count} consecutive free ports below {low}")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------- processes
def python_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def profiled() -> list[str]:
    """The coordinator's command runs under bench/profiled.py when SOAK_TIMERS (thread CPU
    per engine function, real figures) or SOAK_PROFILE (cProfile, every thread) names the
    file its figures go to; the coordinator's CPU figures then include what that costs."""
    timers, profile = os.environ.get(TIMERS_ENV), os.environ.get(PROFILE_ENV)
    script = str(REPO / "bench" / "profiled.py")
    if timers:
        return [script, "--timers", str(Path(timers).resolve())]
    return [script, str(Path(profile).resolve())] if profile else []


class Children:
    """Every process this script starts; each is ended by its own PID, never by name."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def start(self, args: list[str], log_path: Path,
              stdout_path: Path | None = None) -> subprocess.Popen:
        """Output goes to files, not pipes: nothing has to drain them."""
        with open(log_path, "ab") as log, open(stdout_path or os.devnull, "ab") as out:
            popen = subprocess.Popen([sys.executable, *args], cwd=REPO, env=python_env(),
                                     stdin=subprocess.DEVNULL,
                                     stdout=out if stdout_path else log, stderr=log)
        with self._lock:
            # Forget ended processes, so hundreds of restarts keep this list short.
            self._procs = [p for p in self._procs if p.poll() is None]
            self._procs.append(popen)
        return popen

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for popen in procs:
            stop(popen)


def stop(popen: subprocess.Popen, grace: float = STOP_SECONDS) -> None:
    """SIGTERM this PID, wait, then SIGKILL it."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        kill(popen)


def kill(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        with suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGKILL)
        popen.wait(10)


def wait_for_file(path: Path, popen: subprocess.Popen, timeout: float = READY_SECONDS) -> str:
    """The contents of a port file once the process has written it; RuntimeError if the
    process exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if popen.poll() is not None:
            raise RuntimeError(f"process {popen.pid} exited ({popen.returncode}) before "
                               f"writing {path.name}")
        time.sleep(0.05)
    raise RuntimeError(f"process {popen.pid} wrote no {path.name} within {timeout:.0f}s")


@dataclass
class Group:
    """One node-group process and the fixed ports its nodes listen on."""

    index: int
    ports: list[int]
    popen: subprocess.Popen | None = None
    restart_at: float | None = None  # monotonic time; None while it runs
    restart_tries: int = 0
    starts: int = 0

    @property
    def down(self) -> bool:
        return self.restart_at is not None


@dataclass
class Event:
    time: float  # UNIX time, as the run store's timestamps
    kind: str  # kill, restart, restart_failed
    group: int
    nodes: int


class Cluster:
    """Node groups, coordinator and client of one soak run, all in `workdir`."""

    def __init__(self, s: Settings, workdir: Path, data_root: Path, ports: list[int]) -> None:
        self.s = s
        self.workdir = workdir
        self.data_root = data_root
        self.children = Children()
        self.groups: list[Group] = []
        offset = 0
        for i, size in enumerate(group_sizes(s)):
            self.groups.append(Group(i, ports[offset:offset + size]))
            offset += size
        self.coordinator: subprocess.Popen | None = None
        self.client: subprocess.Popen | None = None
        self.run_id = f"soak-{s.seed}"

    def start_group(self, group: Group) -> None:
        """Start (or restart) a group on its ports and wait until all of them listen."""
        port_file = self.workdir / f"group{group.index}.ports"
        port_file.unlink(missing_ok=True)
        # A new load seed per start, so a restarted group does not replay its old draws.
        seed = self.s.seed * 1_000_003 + group.index * 10_007 + group.starts * 101
        group.starts += 1
        group.popen = self.children.start(
            ["-m", "devtools.node_group", "--ports", ",".join(map(str, group.ports)),
             "--port-file", str(port_file), "--load", str(self.s.load),
             "--load-delay", str(self.s.load_delay), "--seed", str(seed),
             "--data-root", str(self.data_root)], self.workdir / f"group{group.index}.log")
        wait_for_file(port_file, group.popen)

    def start_nodes(self) -> Path:
        for group in self.groups:
            self.start_group(group)
        nodes_file = self.workdir / "compute_nodes.txt"
        nodes_file.write_text("".join(f"127.0.0.1,{p}\n" for g in self.groups for p in g.ports))
        return nodes_file

    def start_coordinator(self, nodes_file: Path) -> int:
        port_file = self.workdir / "coordinator.port"
        self.coordinator = self.children.start(
            [*profiled(), str(REPO / "coordinator_node.py"), "0", str(self.s.policy),
             "--host", "127.0.0.1",
             "--nodes-file", str(nodes_file), "--data-root", str(self.data_root),
             "--run-dir", str(self.workdir / "runs"), "--store", self.store,
             "--port-file", str(port_file), "--seed", str(self.s.seed)],
            self.workdir / "coordinator.log")
        return int(wait_for_file(port_file, self.coordinator))

    def start_client(self, port: int) -> None:
        self.client = self.children.start(
            [str(REPO / "client.py"), "127.0.0.1", str(port), *self.training_args(),
             "--run-id", self.run_id, "--out", str(self.workdir / "models"), "--json",
             "--quiet", "--poll", str(self.s.client_poll), "--dead-after", "60"],
            self.workdir / "client.log",
            self.workdir / "client.json")

    def training_args(self) -> list[str]:
        """The run: the positional letters run in sync mode, the same settings as a
        configuration with its schedule in the asynchronous modes."""
        s = self.s
        if s.mode == "sync":
            return [DATASET, str(s.rounds), str(s.epochs), str(s.hidden), "0.05",
                    "--scale-features", "--seed", str(s.seed)]
        settings = {"run.dataset": DATASET, "run.rounds": s.rounds, "run.seed": s.seed,
                    "delta_avg.epochs": s.epochs, "delta_avg.hidden": f"[{s.hidden}]",
                    "delta_avg.eta": 0.05, "delta_avg.scale_features": "true",
                    "schedule.mode": s.mode, "schedule.buffer_size": s.buffer_size}
        return ["--config", str(REPO / "config.yaml"),
                *[arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]]

    @property
    def store(self) -> str:
        """The run store: an SQLite file in the work folder, or --store-url."""
        return self.s.store_url or str(self.workdir / "runs.db")

    def client_result(self) -> dict | None:
        """The client's --json result, if it printed one."""
        with suppress(OSError, ValueError):
            value = json.loads((self.workdir / "client.json").read_text())
            return value if isinstance(value, dict) else None
        return None

    def stop(self) -> None:
        """Client, then coordinator (gracefully, so the store is closed), then the nodes."""
        for popen in (self.client, self.coordinator):
            if popen is not None:
                stop(popen)
        self.children.stop_all()


# ----------------------------------------------------------------- threads
class Killer(threading.Thread):
    """Kills a random group every `kill_every` seconds (jittered) with SIGKILL, and
    restarts each killed group after its downtime, on the same ports."""

    def __init__(self, cluster: Cluster, rng: random.Random, done: threading.Event) -> None:
        super().__init__(name="killer", daemon=True)
        self.cluster = cluster
        self.rng = rng
        self.done = done
        self.events: list[Event] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        s = self.cluster.s
        next_kill = time.monotonic() + self._jitter(s.kill_every)
        try:
            while not self.done.wait(TICK_SECONDS):
                now = time.monotonic()
                for group in self.cluster.groups:
                    if group.down and now >= group.restart_at:
                        self._restart(group)
                if now >= next_kill:
                    self._kill_one()
                    next_kill = now + self._jitter(s.kill_every)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            self.done.set()

    def _jitter(self, mean: float) -> float:
        return mean * self.rng.uniform(0.5, 1.5)

    def _kill_one(self) -> None:
        groups = self.cluster.groups
        down = sum(len(g.ports) for g in groups if g.down)
        limit = self.cluster.s.max_down * self.cluster.s.nodes
        candidates = [g for g in groups if not g.down and down + len(g.ports) <= limit]
        if not candidates:
            return
        group = self.rng.choice(candidates)
        kill(group.popen)
        group.restart_at = time.monotonic() + self._jitter(self.cluster.s.down)
        self.events.append(Event(time.time(), "kill", group.index, len(group.ports)))

    def _restart(self, group: Group) -> None:
        try:
            self.cluster.start_group(group)
        except RuntimeError as exc:
            group.restart_tries += 1
            self.events.append(Event(time.time(), "restart_failed", group.index,
                                     len(group.ports)))
            if group.restart_tries >= MAX_RESTART_TRIES:
                raise RuntimeError(f"group {group.index} did not restart: {exc}") from exc
            group.restart_at = time.monotonic() + 1.0
            return
        group.restart_at, group.restart_tries = None, 0
        self.events.append(Event(time.time(), "restart", group.index, len(group.ports)))


@dataclass
class Sample:
    time: float  # UNIX time
    cpu_seconds: float  # user + system, since the process started
    rss_mib: float
    threads: int
    fds: int
    loadavg: float


def read_sample(pid: int) -> Sample | None:
    """One reading of a process from /proc; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces; fields 3.. follow
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in values:  # a zombie: exited, not yet reaped
        return None
    return Sample(time=time.time(), cpu_seconds=ticks / os.sysconf("SC_CLK_TCK"),
                  rss_mib=int(values["VmRSS"].split()[0]) / 1024,
                  threads=int(values["Threads"]), fds=fds, loadavg=os.getloadavg()[0])


class Sampler(threading.Thread):
    """Reads the coordinator's /proc entries every `every` seconds until `done` or its exit."""

    def __init__(self, pid: int, every: float, done: threading.Event) -> None:
        super().__init__(name="sampler", daemon=True)
        self.pid = pid
        self.every = every
        self.done = done
        self.samples: list[Sample] = []

    def run(self) -> None:
        while True:
            sample = read_sample(self.pid)
            if sample is None:
                return
            self.samples.append(sample)
            if self.done.wait(self.every):
                return


# ------------------------------------------------------------ coordinator log
REFUSED = re.compile(r"run store refused (\w+)")
FAILED_UNIT = re.compile(r"WARNING unit \S+ on \S+ failed: (.*)")


def log_notes(path: Path) -> tuple[dict[str, int], list[str]]:
    """What the coordinator logged beyond round lines: ledger writes the store refused
    (by call), unit attempts that failed (by cause) and errors; plus a few examples."""
    counts: Counter[str] = Counter()
    examples: list[str] = []
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.splitlines():
        if match := REFUSED.search(line):
            counts[f"run store refused {match.group(1)}"] += 1
            if len(examples) < 4:
                examples.append(line.split(" WARNING ", 1)[-1])
        elif match := FAILED_UNIT.search(line):
            counts[f"attempt failed: {_cause(match.group(1))}"] += 1
        elif " ERROR " in line or "Traceback" in line:
            counts["errors"] += 1
            if len(examples) < 8:
                examples.append(line)
    return dict(sorted(counts.items())), examples


def _cause(message: str) -> str:
    """A failure message without its addresses and numbers, so that causes group."""
    return re.sub(r"\d+(\.\d+)*(:\d+)?", "N", message)[:80]


# ----------------------------------------------------------------- figures
@dataclass
class Tenth:
    rounds: str
    units: int
    seconds: float
    units_per_second: float
    kills: int
    cpu_percent: float
    cpu_ms_per_unit: float
    rss_mib: float  # the largest sample in the window
    threads: int
    fds: int
    loadavg: float  # the machine's 1-minute load average, mean of the window's samples


def cpu_at(samples: list[Sample], t: float) -> float:
    """The coordinator's CPU seconds at time t, interpolated between samples."""
    times = [x.time for x in samples]
    return float(np.interp(t, times, [x.cpu_seconds for x in samples]))


def tenths(ledger: Ledger, samples: list[Sample], events: list[Event]) -> list[Tenth]:
    """The run cut into ten spans of equal round counts (the last rounds of each span
    mark its end), with throughput, kills and the coordinator's resources in each."""
    rounds = len(ledger.round_ends)
    bounds = [round(rounds * i / 10) for i in range(11)]
    rows = []
    for i in range(10):
        first, last = bounds[i], bounds[i + 1]
        if last <= first:
            continue
        start = ledger.run_started if first == 0 else ledger.round_ends[first - 1]
        end = ledger.round_ends[last - 1]
        inside = [x for x in samples if start <= x.time <= end] or [
            min(samples, key=lambda x: abs(x.time - end))]
        units = sum(ledger.round_units[first:last])
        seconds = max(end - start, 1e-9)
        cpu = cpu_at(samples, end) - cpu_at(samples, start)
        rows.append(Tenth(
            rounds=f"{first + 1}-{last}", units=units, seconds=seconds,
            units_per_second=units / seconds,
            kills=sum(1 for e in events if e.kind == "kill" and start <= e.time < end),
            cpu_percent=100 * cpu / seconds, cpu_ms_per_unit=1000 * cpu / max(units, 1),
            rss_mib=max(x.rss_mib for x in inside), threads=max(x.threads for x in inside),
            fds=max(x.fds for x in inside),
            loadavg=float(np.mean([x.loadavg for x in inside]))))
    return rows


def tenths_table(rows: list[Tenth]) -> str:
    lines = ["| tenth | rounds | units | seconds | units/s | kills | coordinator CPU % | "
             "CPU ms/unit | RSS MiB (max) | threads (max) | open fds (max) | load avg |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, r in enumerate(rows, start=1):
        lines.append(f"| {i} | {r.rounds} | {r.units:,} | {r.seconds:.1f} | "
                     f"{r.units_per_second:.1f} | {r.kills} | {r.cpu_percent:.0f} | "
                     f"{r.cpu_ms_per_unit:.2f} | {r.rss_mib:.1f} | {r.threads} | {r.fds} | "
                     f"{r.loadavg:.1f} |")
    return "\n".join(lines)


def summary(s: Settings, ledger: Ledger, samples: list[Sample], events: list[Event],
            result: dict | None) -> dict:
    start, end = ledger.run_started, ledger.run_ended
    wall = end - start
    completed = ledger.statuses.get("completed", 0)
    kills = [e for e in events if e.kind == "kill"]
    cpu = cpu_at(samples, end) - cpu_at(samples, start)
    during = [x for x in samples if start <= x.time <= end] or samples
    return {
        "rounds": len(ledger.round_ends), "units_planned": sum(ledger.statuses.values()),
        "units_completed": completed, "units_discarded": ledger.statuses.get("discarded", 0),
        "wall_seconds": wall, "units_per_second": completed / wall if wall > 0 else 0.0,
        "kills": len(kills), "nodes_killed": sum(e.nodes for e in kills),
        "kills_of_one_node": sum(1 for e in kills if e.nodes == 1),
        "restarts": sum(1 for e in events if e.kind == "restart"),
        "restarts_failed": sum(1 for e in events if e.kind == "restart_failed"),
        "attempts": ledger.attempts, "coordinator_cpu_seconds": cpu,
        "coordinator_cpu_percent": 100 * cpu / wall if wall > 0 else 0.0,
        "rss_mib_first": during[0].rss_mib, "rss_mib_last": during[-1].rss_mib,
        "rss_mib_max": max(x.rss_mib for x in during),
        "validation_error": result.get("validation_error") if result else None,
    }


def report(s: Settings, groups: list[int], totals: dict, rows: list[Tenth],
           outcome: Outcome) -> str:
    ledger = outcome.ledger
    a = totals["attempts"]
    lines = [
        f"soak: {s.nodes} nodes in {len(groups)} processes (sizes {groups}), policy {s.policy}, "
        f"load {s.load} / {s.load_delay}s, {s.units} units of {s.rows} rows, MLP "
        f"16-{s.hidden}-26, {s.epochs} epoch(s), client status every {s.client_poll:g}s, "
        f"seed {s.seed}",
        f"machine: {machine()}",
        f"rounds {totals['rounds']}, units {totals['units_planned']:,} planned, "
        f"{totals['units_completed']:,} completed, {totals['units_discarded']} discarded, "
        f"in {totals['wall_seconds']:.1f} s: {totals['units_per_second']:.1f} units/s",
        f"kills {totals['kills']} ({totals['nodes_killed']} nodes; "
        f"{totals['kills_of_one_node']} of a single node), restarts {totals['restarts']}, "
        f"failed restarts {totals['restarts_failed']}",
        f"attempts: {sum(a.values()):,} ({', '.join(f'{k} {v:,}' for k, v in sorted(a.items()))})",
        f"coordinator: CPU {totals['coordinator_cpu_seconds']:.1f} s "
        f"({totals['coordinator_cpu_percent']:.0f} % of one core), RSS "
        f"{totals['rss_mib_first']:.1f} -> {totals['rss_mib_last']:.1f} MiB "
        f"(max {totals['rss_mib_max']:.1f})",
        f"final validation error: {totals['validation_error']}",
        "", tenths_table(rows), "", "ledger check:"]
    lines += [f"  [{'ok' if c.ok else 'FAILED'}] {c.name}: {c.detail}" for c in ledger.checks]
    lines += [f"  discarded: {r}" for r in ledger.discarded_reasons]
    lines.append("coordinator log:")
    lines += [f"  {n:6,}  {what}" for what, n in outcome.notes.items()] or ["  nothing unusual"]
    lines += [f"  e.g. {example}" for example in outcome.examples]
    lines.append(f"ledger check: {'passed' if ledger.ok else 'FAILED'}")
    return "\n".join(lines)


def machine() -> str:
    return (f"nproc {os.cpu_count()}, {cpu_model()}, Linux {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def plot(path: Path, ledger: Ledger, samples: list[Sample], events: list[Event]) -> None:
    """Units/s per 5 s, the coordinator's CPU % and RSS, and the machine's load average
    over the run; kills as grey lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not ledger.round_ends or len(samples) < 2:
        return
    t0 = ledger.run_started
    fig, axes = plt.subplots(4, 1, figsize=(9, 8.5), sharex=True)
    ends = np.array(ledger.round_ends) - t0
    bins = np.arange(0, max(ends.max(), 5) + 5, 5)
    units, _ = np.histogram(ends, bins=bins, weights=ledger.round_units)
    axes[0].step(bins[:-1], units / 5, where="post")
    axes[0].set_ylabel("units/s (5 s bins)")
    times = np.array([x.time for x in samples]) - t0
    cpu = np.diff([x.cpu_seconds for x in samples]) / np.maximum(np.diff(times), 1e-9) * 100
    smooth = np.convolve(cpu, np.ones(5) / 5, mode="same")  # 5-sample mean: less jitter
    axes[1].plot(times[1:], smooth, lw=0.8)
    axes[1].set_ylabel("coordinator CPU %")
    axes[1].set_ylim(bottom=0)
    axes[2].plot(times, [x.rss_mib for x in samples])
    axes[2].set_ylabel("coordinator RSS MiB")
    axes[2].set_ylim(bottom=0)
    axes[3].plot(times, [x.loadavg for x in samples], color="tab:red")
    axes[3].set_ylabel("machine load avg")
    axes[3].set_ylim(bottom=0)
    axes[3].set_xlabel("seconds since the run started (RSS jumps at the end: model and "
                       "curves written)")
    for e in events:
        if e.kind == "kill":
            for ax in axes:
                ax.axvline(e.time - t0, color="grey", alpha=0.25, lw=0.6)
    axes[0].set_title("soak: grey lines are SIGKILLs of node processes")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -------------------------------------------------------------------- run
@dataclass
class Outcome:
    client_rc: int | None
    ledger: Ledger
    samples: list[Sample]
    events: list[Event]
    result: dict | None
    problems: list[str] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)


def soak(s: Settings, workdir: Path) -> Outcome:
    """One soak run in `workdir`; every process it starts is ended before it returns."""
    rng = random.Random(s.seed)
    data_root = make_dataset(workdir / "data", s.units, s.rows)
    cluster = Cluster(s, workdir, data_root, pick_ports(s.nodes, random.Random()))
    done = threading.Event()
    killer = Killer(cluster, rng, done)
    sampler: Sampler | None = None
    problems: list[str] = []
    try:
        port = cluster.start_coordinator(cluster.start_nodes())
        sampler = Sampler(cluster.coordinator.pid, 1.0, done)
        sampler.start()
        cluster.start_client(port)
        killer.start()
        problems += wait_client(cluster, s.timeout, done)
    finally:
        done.set()
        if killer.is_alive():
            killer.join(READY_SECONDS + 5)
        cluster.stop()
    if killer.error is not None:
        problems.append(f"killer: {killer.error}")
    ledger = audit_store(cluster.store, cluster.run_id,
                         RunShape(s.rounds, s.units, s.mode, s.results_per_round))
    notes, examples = log_notes(workdir / "coordinator.log")
    return Outcome(cluster.client.returncode, ledger, sampler.samples, killer.events,
                   cluster.client_result(), problems, notes, examples)


def wait_client(cluster: Cluster, timeout: float, done: threading.Event) -> list[str]:
    """Wait for the client to finish (bounded); what went wrong, if anything."""
    deadline = time.monotonic() + timeout
    while cluster.client.poll() is None and not done.is_set():
        if time.monotonic() > deadline:
            return [f"the run did not finish within {timeout:.0f}s"]
        if cluster.coordinator.poll() is not None:
            return [f"the coordinator exited ({cluster.coordinator.returncode})"]
        time.sleep(0.2)
    if cluster.client.poll() is None:
        return ["stopped before the client finished"]
    if cluster.client.returncode != 0:
        tail = (cluster.workdir / "client.log").read_text(errors="replace")[-600:]
        return [f"the client exited {cluster.client.returncode}: {tail.strip()}"]
    return []


def _interrupt_on_signals() -> None:
    """SIGTERM ends the soak like Ctrl-C, so the finally blocks end every child."""
    def handler(signum: int, frame: object) -> None:  # noqa: ARG001 - signal signature
        # Once only: a second signal must not interrupt the clean-up it started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main(argv: list[str] | None = None) -> int:
    s, args = parse_args(argv)
    _interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            outcome = soak(s, workdir)
        except KeyboardInterrupt:
            print("soak: interrupted; every process it started was ended", file=sys.stderr)
            return 130
        except (RuntimeError, OSError) as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return 1
        if not outcome.samples:
            print(f"soak: no sample of the coordinator; {outcome.problems}", file=sys.stderr)
            return 1
        rows = tenths(outcome.ledger, outcome.samples, outcome.events)
        totals = summary(s, outcome.ledger, outcome.samples, outcome.events, outcome.result)
        print(report(s, group_sizes(s), totals, rows, outcome))
        for problem in outcome.problems:
            print(f"problem: {problem}")
        if args.json:
            write_json(Path(args.json), s, totals, rows, outcome)
        if args.plot:
            plot(Path(args.plot), outcome.ledger, outcome.samples, outcome.events)
    return 0 if outcome.ledger.ok and not outcome.problems else 1


def write_json(path: Path, s: Settings, totals: dict, rows: list[Tenth],
               outcome: Outcome) -> None:
    data = {"settings": asdict(s), "machine": machine(), "totals": totals,
            "tenths": [asdict(r) for r in rows], "ledger_ok": outcome.ledger.ok,
            "checks": [asdict(c) for c in outcome.ledger.checks],
            "problems": outcome.problems, "log_notes": outcome.notes,
            "log_examples": outcome.examples, "events": [asdict(e) for e in outcome.events],
            "samples": [asdict(x) for x in outcome.samples]}
    path.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    sys.exit(main())
