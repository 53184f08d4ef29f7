"""The coordinator's view of its compute nodes: connections, statistics and benching."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from coordinator.nodes_file import NodeAddress
from coordinator.policies import NodeView
from wire.generated import ComputeNode, ttypes
from wire.rpc import ConnectionPool

log = logging.getLogger("coordinator.nodes")

# A node that failed waits this long before it is tried again, doubling up to the cap.
BENCH_FIRST_SECONDS = 0.5
BENCH_MAX_SECONDS = 10.0
CONTROL_TIMEOUT_SECONDS = 5.0


@dataclass
class NodeStats:
    """Per-run counts users see in the summary."""

    accepted: int = 0
    rejected: int = 0
    delayed: int = 0
    failed: int = 0
    cancelled: int = 0
    busy_seconds: float = 0.0
    compute_seconds: float = 0.0
    delay_seconds: float = 0.0


class NodeHandle:
    """One compute node: pooled connections, counters, and the bench after failures."""

    def __init__(self, index: int, address: NodeAddress, rpc_timeout: float,
                 connect_timeout: float) -> None:
        self.index = index
        self.address = address
        self.name = str(address)
        self.stats = NodeStats()
        self.in_flight = 0
        self._lock = threading.Lock()
        self._compute_seconds: float | None = None  # moving averages for the policy
        self._delay_seconds: float | None = None
        self._benched_until = 0.0
        self._bench_seconds = 0.0
        self._work = ConnectionPool(ComputeNode.Client, address.host, address.port,
                                    connect_timeout=connect_timeout, read_timeout=rpc_timeout)
        self._control = ConnectionPool(ComputeNode.Client, address.host, address.port,
                                       connect_timeout=connect_timeout,
                                       read_timeout=CONTROL_TIMEOUT_SECONDS)

    # ------------------------------------------------------------------ calls
    def train(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        """One training call; transport errors propagate to the engine."""
        with self._work.client() as client:
            return client.train_with_weights(request)

    def cancel(self, run_id: str, unit_id: str) -> None:
        """Best effort: a node that cannot be told will time out the attempt anyway."""
        try:
            with self._control.client() as client:
                client.cancel_unit(ttypes.CancelUnitRequest(run_id=run_id, unit_id=unit_id))
        except Exception as exc:  # noqa: BLE001 - cancellation is advisory
            log.debug("could not cancel %s on %s: %s", unit_id, self.name, exc)

    def close(self) -> None:
        self._work.close()
        self._control.close()

    # -------------------------------------------------------------- bookkeeping
    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def finished(self, result: ttypes.TrainResult, seconds: float) -> None:
        """Record an answer (any outcome): the node is alive, so it leaves the bench."""
        with self._lock:
            self.in_flight -= 1
            self._bench_seconds = 0.0
            self.stats.busy_seconds += seconds
            self.stats.compute_seconds += result.compute_seconds
            self.stats.delay_seconds += result.delay_seconds
            outcome = result.outcome
            if outcome == ttypes.UnitOutcome.REJECTED:
                self.stats.rejected += 1
                return
            if result.delay_seconds > 0:
                self.stats.delayed += 1
                self._delay_seconds = _moving_average(self._delay_seconds,
                                                      result.delay_seconds)
            elif outcome == ttypes.UnitOutcome.COMPLETED:
                self._compute_seconds = _moving_average(self._compute_seconds,
                                                        result.compute_seconds)
            if outcome == ttypes.UnitOutcome.CANCELLED:
                self.stats.cancelled += 1
            else:
                self.stats.accepted += 1

    def failed(self, seconds: float, bench: bool) -> None:
        """Record a failed call; a node that did not answer is benched with growing back-off."""
        with self._lock:
            self.in_flight -= 1
            self.stats.failed += 1
            self.stats.busy_seconds += seconds
            if bench:
                self._bench_seconds = min(BENCH_MAX_SECONDS,
                                          max(BENCH_FIRST_SECONDS, self._bench_seconds * 2))
                self._benched_until = time.monotonic() + self._bench_seconds

    def benched_until(self) -> float:
        with self._lock:
            return self._benched_until

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

    def summary(self) -> ttypes.NodeSummary:
        with self._lock:
            s = self.stats
            return ttypes.NodeSummary(node=self.name, accepted=s.accepted, rejected=s.rejected,
                                      delayed=s.delayed, failed=s.failed, cancelled=s.cancelled,
                                      busy_seconds=s.busy_seconds,
                                      compute_seconds=s.compute_seconds,
                                      delay_seconds=s.delay_seconds)


def _moving_average(previous: float | None, value: float, weight: float = 0.3) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value
