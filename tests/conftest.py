"""Shared fixtures: a local cluster of real compute-node and coordinator processes; the
`processes` marker, which every test under tests/integration and tests/e2e carries and
which a test elsewhere must not need (the fast tier: -m "not processes and not slow", so
also without the tests marked slow, which wait out a real deadline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import local_cluster as procs
from devtools.postgres_cluster import PostgresCluster

# A write the run store refuses is a bug: in tests it raises, here and in the coordinator
# processes the tests start (they inherit the environment), instead of a log line.
os.environ["TRAINER_STRICT_LEDGER"] = "1"

TESTS = Path(__file__).resolve().parent
MARKED_DIRECTORIES = ("integration", "e2e")  # every test there starts processes or sockets
# Audit events of starting a process or using a network socket.
PROCESS_OR_SOCKET = {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system",
                     "socket.bind", "socket.connect"}
_unmarked_test_events: list[str] | None = None  # a list while a test without the marker runs


def _record_process_or_socket(event: str, args: tuple) -> None:
    if _unmarked_test_events is not None and event in PROCESS_OR_SOCKET:
        _unmarked_test_events.append(f"{event} {args[1] if event.startswith('socket') else args}")


sys.addaudithook(_record_process_or_socket)  # for the whole session: hooks cannot be removed


# Tests whose processes hold gigabytes (models bigger than a frame, a soak's many nodes):
# under pytest-xdist (scripts/test.sh) they share one worker, one after another, so that
# two of them never run at once on a 24 GiB machine.
ONE_AT_A_TIME = {"test_big_payloads.py", "test_soak.py"}
# Modules whose tests share a module-scoped fixture that starts processes or trains (a
# cluster several tests train through, each run under its own run id): under pytest-xdist
# each runs on one worker, so the fixture is set up once rather than once on every worker
# that gets one of its tests (bench/mdgan_paper.py --quick took a minute or more, up to
# four times).
SHARED_SETUP = {"test_mdgan_paper.py", "test_plugin_names.py", "test_dashboard_http.py",
                "test_secure_cluster.py", "test_client_examples.py", "test_bad_plugins.py",
                "test_federated_clients.py", "test_clients_algorithms.py",
                "test_md_gan_cluster.py", "test_own_model_features.py", "test_example_gpt.py",
                "test_examples_cnn_tabular.py", "test_model_scoring.py", "test_failover.py",
                "test_local_workers.py"}
# The modules that take longest on their worker (a group above: all its tests; otherwise
# its longest test), longest first (measured with --durations and per-test CPU time):
# under pytest-xdist they start before the rest rather than last on one worker while the
# others are idle. (The scheduler below hands out the tests and groups in this order, then
# the others as collected.)
SLOW_FIRST = ("test_big_payloads.py", "test_install.py", "test_federated_clients.py",
              "test_relays.py", "test_clients_algorithms.py", "test_md_gan_cluster.py",
              "test_mdgan_paper.py", "test_bad_plugins.py", "test_failover.py",
              "test_own_model_features.py", "test_local_workers.py", "test_example_gpt.py",
              "test_compression_runs.py", "test_readme_own_model.py",
              "test_plugin_examples.py", "test_async_runs.py", "test_cancel.py",
              "test_simulation.py", "test_examples_cnn_tabular.py", "test_model_scoring.py",
              "test_training_runs.py", "test_fenced_leader.py", "test_faults.py",
              "test_store_outage.py", "test_robust_aggregation.py")


def pytest_configure(config: pytest.Config) -> None:
    _share_bytecode(config)


def _share_bytecode(config: pytest.Config) -> None:
    """Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE), every
    node, coordinator and client process the tests start would compile the trainer's
    sources again, about a third of a minimal run's CPU time. For the processes this session
    starts (its xdist workers included, which start after this hook) bytecode goes to a
    folder of pytest's cache instead, outside the source tree, as the environment wants."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    if hasattr(config, "workerinput") or getattr(config, "cache", None) is None:
        return  # an xdist worker has it from the controller; no cache: leave it as it is
    os.environ["PYTHONPYCACHEPREFIX"] = str(config.cache.mkdir("bytecode"))
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    marked = [TESTS / directory for directory in MARKED_DIRECTORIES]
    for item in items:
        if any(directory in item.path.parents for directory in marked):
            item.add_marker(pytest.mark.processes)
    rank = {name: index for index, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: modules stay whole


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201
    """--dist loadgroup with the groups above, read from each test's id. (pytest-xdist's own
    xdist_group marker groups nothing under pytest 9: it appends the group to an id that
    pytest no longer reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # SLOW_FIRST's order, not the most tests first

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            name = path.rsplit("/", 1)[-1]
            if name in ONE_AT_A_TIME:
                return "one_at_a_time"
            return path if name in SHARED_SETUP else nodeid

    return Groups(config, log)


@pytest.fixture(scope="module", autouse=True)
def _warm_starts(request: pytest.FixtureRequest) -> Iterator[None]:
    """The trainer's scripts a module's tests start are forked from a warm starter
    (devtools/warm_starts.py: about 2 CPU seconds saved on each), except in modules marked
    `fresh_processes` (they measure a process's memory, which a forked one shares) and
    when TRAINER_TEST_FRESH_PROCESSES=1 asks for fresh interpreters everywhere."""
    wanted = (request.node.get_closest_marker("fresh_processes") is None
              and os.environ.get("TRAINER_TEST_FRESH_PROCESSES", "") != "1")
    procs.warm_starts = wanted
    yield
    procs.warm_starts = False


@pytest.fixture(autouse=True)
def _processes_only_where_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without the `processes` marker fails if it starts a process or uses a socket,
    so the fast tier stays fast and self-contained."""
    global _unmarked_test_events
    if request.node.get_closest_marker("processes") is not None:
        yield
        return
    _unmarked_test_events = []
    try:
        yield
    finally:
        seen, _unmarked_test_events = _unmarked_test_events, None
    if seen:
        pytest.fail("started a process or used a socket without the `processes` marker "
                    f"(move it to tests/integration): {seen[:3]}")


class Cluster:
    """Nodes and a coordinator in their own processes on 127.0.0.1, ended by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.nodes: list[procs.Proc] = []
        self.coordinator: procs.Proc | None = None

    def add_node(self, load: float = 0.0, *extra: str) -> procs.Proc:
        node = procs.start_node(self.workdir, f"node{len(self.nodes) + 1}", load,
                                "--seed", str(len(self.nodes) + 1), *extra)
        self.nodes.append(node)
        return node

    def start_coordinator(self, policy: int = 2, *extra: str,
                          nodes: list[procs.Proc] | None = None) -> procs.Proc:
        nodes_file = procs.write_nodes_file(self.workdir / "compute_nodes.txt",
                                            self.nodes if nodes is None else nodes)
        self.coordinator = procs.start_coordinator(self.workdir, nodes_file, policy, *extra)
        return self.coordinator

    def client(self, *args: str, timeout: float = 120.0):
        try:
            return procs.run_client(["127.0.0.1", str(self.coordinator.port), *args],
                                    self.workdir, timeout=timeout)
        except subprocess.TimeoutExpired as exc:  # the servers' logs say where it waited
            raise AssertionError(f"{exc}\n{exc.stderr or ''}\n{self.logs()}") from exc

    def start_client(self, *args: str) -> subprocess.Popen:
        """The client in the background, for tests that act while it trains. It takes
        Ctrl-C (SIGINT) as in a terminal even when the tests themselves run as a
        background job, whose shell has SIGINT ignored (an ignored signal is inherited)."""
        return subprocess.Popen(
            [sys.executable, str(procs.REPO / "client.py"), "127.0.0.1",
             str(self.coordinator.port), *args], cwd=self.workdir, env=procs.python_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_take_ctrl_c)

    def train_json(self, *args: str, timeout: float = 120.0) -> dict:
        done = self.client(*args, "--json", timeout=timeout)
        assert done.returncode == 0, done.stderr + self.logs()
        return json.loads(done.stdout)

    def logs(self) -> str:
        parts = [f"--- {p.log_path.name}\n{p.log()}" for p in [*self.nodes, self.coordinator]
                 if p is not None]
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in [self.coordinator, *self.nodes]:
            if proc is not None:
                proc.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests of a module that train through the same nodes and
    coordinator, each run under a run id of its own: starting the processes (and loading
    torch in each node) is much of a short run's CPU time."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


def _take_ctrl_c() -> None:
    """In the child before exec: SIGINT back to its default, so Python turns it into
    KeyboardInterrupt (it leaves an inherited "ignore" alone)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL server for the session (devtools/postgres_cluster.py), in a
    folder of its own under the system's temporary folder, which its account can reach
    (pytest's are private to root)."""
    server = PostgresCluster()
    try:
        yield server.start()
    finally:
        server.remove()


@pytest.fixture
def postgres_url(postgres_server: PostgresCluster) -> str:
    """A fresh, empty database on the session's server: its URL."""
    import psycopg  # only where a test uses PostgreSQL

    global _databases
    _databases += 1
    name = f"test_{os.getpid()}_{_databases}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return postgres_server.url.rsplit("/", 1)[0] + f"/{name}"


_databases = 0
