"""The coordinator's view of its compute nodes: connections, statistics and benching."""

from __future__ import annotations

import logging

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.client import NodeClient, NodePing
from thrift_trainer.engine.nodes.errors import NodeError
from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.policies import NodeView
from thrift_trainer.engine.records import NodeCounts, NodeSummary
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.wire.stats import PayloadBytes

log = logging.getLogger("coordinator.nodes")

# A node that failed waits this long before it is tried again, doubling up to the cap.
BENCH_FIRST_SECONDS = 0.5
BENCH_MAX_SECONDS = 10.0


class NodeHandle:
    """One compute node as the engine sees it: its client (engine.nodes.client),
    counters, liveness, and the bench after failures."""

    def __init__(self, index: int, name: str, client: NodeClient) -> None:
        self.index = index
        self.name = name
        self.client = client
        self.address = client.address
        self.stats = NodeCounts()  # this run's counts, as its summary shows them
        self.in_flight = 0
        self.role: str | None = None  # from its pings: a relay, local workers (NodeInfo)
        self.members: list[NodeSummary] = []  # a relay's group, from its pings
        self.liveness = Liveness()
        self._lock = runtime.Lock()
        self._compute_seconds: float | None = None  # moving averages for the policy
        self._delay_seconds: float | None = None
        self._benched_until = 0.0
        self._bench_seconds = 0.0
        self.left_out: str | None = None  # why the run does without this node, if it does
        # The federated clients whose data it holds, as its run check said (None: every
        # one). Until a pushed node has answered the check it holds none: a node started
        # with --clients would refuse the others. A pull node is never asked (it holds
        # every client of a partitioned run).
        self.clients: frozenset[str] | None = None
        self.clients_checked = not client.accepts_connections
        # Node-resident clients (its own data is its client): their examples and label
        # counts as it announced them (None: kept private).
        self.client_sizes: dict[str, int] = {}
        self.client_labels: dict[str, dict[int, int] | None] = {}
        self.client_fingerprints: dict[str, str] = {}  # of each one's data
        self.refused: str | None = None  # why its last refused result was refused

    @property
    def accepts_connections(self) -> bool:
        return self.client.accepts_connections

    @property
    def payload(self) -> PayloadBytes:
        """Bytes of this node's training calls, counted by its client."""
        return self.client.payload

    @payload.setter
    def payload(self, counter: PayloadBytes) -> None:
        self.client.payload = counter  # RunNodes shares one counter among a run's nodes

    # ------------------------------------------------------------------ calls
    def train(self, task: Task) -> TaskResult:
        """One training call; failures raise engine.nodes.errors (AttemptAborted with
        the reason for a call aborted from outside)."""
        result = self.client.train(task)
        self.liveness.heard()
        return result

    def abort(self, key: tuple[str, str, int], reason: str) -> bool:
        """Give up an attempt in progress (its call fails at once with `reason`)."""
        return self.client.abort(key, reason)

    def heartbeat(self, warm_up: str | None = None) -> NodePing | None:
        """Ping the node (asking it to warm up for the model `warm_up`, if given); an
        answer marks it alive and tells which units are delaying and what the node is (a
        relay and its group). The answer, or None when the node did not answer."""
        try:
            info = self.client.ping(warm_up=warm_up)
        except NodeError as exc:  # silence is what liveness measures
            log.debug("heartbeat to %s failed: %s", self.name, exc)
            return None
        self.liveness.heard(info.delaying, info.progress)
        self.role, self.members = info.role, list(info.members)
        return info

    def refresh_group(self) -> None:
        """Ping a relay now, so its members' counts are current (a summary at a run's
        end, or a relay answering a ping for its own group); other nodes are left be."""
        if self.members:
            self.heartbeat()

    def can_be_told(self) -> bool:
        """Whether a cancel may reach the node now: a silent node would only make the
        sender wait out the control timeout."""
        return self.liveness.state() == "alive"

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        """Best effort: a node that cannot be told will time out the attempt anyway.
        Blocks up to the control timeout: callers send it through engine.cancels."""
        try:
            self.client.cancel(run_id, unit_id, attempt)
        except NodeError as exc:  # cancellation is advisory
            log.debug("could not cancel %s on %s: %s", unit_id, self.name, exc)

    def close(self) -> None:
        self.client.close()

    # -------------------------------------------------------------- bookkeeping
    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, result: TaskResult, seconds: float, counted: bool = True) -> None:
        """Record an answer (any outcome): the node is alive, so it leaves the bench.
        Not `counted`: an answer after the run's end, which its counters leave out."""
        with self._lock:
            self.in_flight -= 1
            self._bench_seconds = 0.0
            if not counted:
                return
            self.stats.busy_seconds += seconds
            self.stats.compute_seconds += result.compute_seconds
            self.stats.delay_seconds += result.delay_seconds
            status = result.status
            if status == TaskStatus.REJECTED:
                self.stats.rejected += 1
                return
            if result.delay_seconds > 0:
                self.stats.delayed += 1
                self._delay_seconds = _moving_average(self._delay_seconds,
                                                      result.delay_seconds)
            elif status == TaskStatus.COMPLETED:
                self._compute_seconds = _moving_average(self._compute_seconds,
                                                        result.compute_seconds)
            if status == TaskStatus.CANCELLED:
                self.stats.cancelled += 1
            else:
                self.stats.accepted += 1
                self.stats.samples += result.num_samples

    def failed(self, seconds: float, bench: bool, counted: bool = True) -> None:
        """Record a failed call; a node that did not answer is benched with growing back-off."""
        with self._lock:
            self.in_flight -= 1
            if counted:
                self.stats.failed += 1
                self.stats.busy_seconds += seconds
            if bench:
                self._bench_seconds = min(BENCH_MAX_SECONDS,
                                          max(BENCH_FIRST_SECONDS, self._bench_seconds * 2))
                self._benched_until = runtime.monotonic() + self._bench_seconds
        if bench:  # the node may have restarted: its idle connections are dead
            self.client.forget_connections()

    def refuse(self, reason: str) -> None:
        """A result of this node was refused (it is benched as for a failed call)."""
        with self._lock:
            self.refused = reason

    def vindicate(self) -> None:
        """Its refused result was right (another node computed it alike): it leaves the
        bench at once, and its summary no longer says it was refused."""
        with self._lock:
            self._benched_until = 0.0
            self._bench_seconds = 0.0
            self.refused = None

    def leave_out(self, reason: str) -> bool:
        """The run does without this node from now on (it cannot serve the run); False if
        it already did."""
        with self._lock:
            first, self.left_out = self.left_out is None, self.left_out or reason
        return first

    def holds(self, client: str | None) -> bool:
        """Whether the node can compute a unit of ``client`` (None: a unit of no client)."""
        if client is None:
            return True
        return self.clients_checked and (self.clients is None or client in self.clients)

    def unit_seconds(self) -> float | None:
        """This node's recent undelayed unit time (a moving average), once it has one."""
        with self._lock:
            return self._compute_seconds

    def benched_until(self) -> float:
        with self._lock:
            return self._benched_until

    def available(self, now: float) -> bool:
        """Whether the node is off the bench at `now` (as its `view` says). No lock: one
        attribute read is atomic, and this is asked of every node for every attempt."""
        return now >= self._benched_until

    def view(self, now: float) -> NodeView:
        with self._lock:
            return NodeView(
                index=self.index,
                in_flight=self.in_flight,
                admitted=self.stats.accepted + self.stats.cancelled,
                rejected=self.stats.rejected,
                delayed=self.stats.delayed,
                compute_seconds=self._compute_seconds,
                delay_seconds=self._delay_seconds,
                available=now >= self._benched_until,
            )

    def summary(self) -> NodeSummary:
        with self._lock:
            return NodeSummary(**self.stats.count_fields(), node=self.name,
                               state="left out" if self.left_out else self.liveness.state(),
                               note=self.left_out, refused=self.refused,
                               silent_seconds=self.liveness.silent_seconds(),
                               pull=not self.accepts_connections, role=self.role,
                               members=list(self.members))


def _moving_average(previous: float | None, value: float, weight: float = 0.3) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value
