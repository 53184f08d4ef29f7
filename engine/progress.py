"""Live progress of one run, read by the status call while the run goes on."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable

from thrift_trainer.engine import runtime
from thrift_trainer.engine.records import NodeSummary, RoundMetrics, RunSnapshot

RUNNING, COMPLETED, FAILED, CANCELLED = "running", "completed", "failed", "cancelled"
# Rounds whose metrics each status carries: a client that polls every 0.5 s still prints
# every round of a run whose rounds take 10 ms.
RECENT_ROUNDS = 64


class RunProgress:
    """Thread-safe counters of a run; `snapshot()` reads them all at once."""

    def __init__(self, run_id: str, rounds: int, units_per_round: int,
                 node_summaries: Callable[[], list[NodeSummary]]) -> None:
        self.run_id = run_id
        self.rounds = rounds
        self.units_total = rounds * units_per_round
        self._node_summaries = node_summaries
        self._lock = runtime.Lock()
        self._started = runtime.monotonic()
        self._ended: float | None = None
        self.state = RUNNING
        self.message: str | None = None
        self.round = 0
        self.validation_error = -1.0
        self.units_done = 0
        self.rejected = 0
        self.failed = 0
        self.in_flight = 0
        self.stale = 0
        self.cancelled = 0
        self.epoch: float | None = None
        self.train_loss: float | None = None
        self.client_figures: dict[str, float] = {}  # federated clients (clients_done)
        self.discarded = 0
        self.discard_reason: str | None = None
        self._recent: deque[RoundMetrics] = deque(maxlen=RECENT_ROUNDS)
        # The nodes as the run ended: their heartbeats stop with the run, so their live
        # state would drift to "dead" while they are still up.
        self._final_nodes: list[NodeSummary] | None = None
        self.mode = "sync"
        self.algorithm: str | None = None  # the run's names, for `client.py runs`
        self.model: str | None = None
        # Asynchronous modes: the version, pass and todo / pending / done counts, read from
        # the run's stream (engine/stream_state.py) at each snapshot.
        self.stream_counts: Callable[[], dict[str, int]] | None = None

    def add(self, **counts: int) -> None:
        """Add to counters by name, e.g. add(units_done=1, in_flight=-1). An ended run's
        counters are final (see `end`): what still comes changes nothing."""
        with self._lock:
            if self.state != RUNNING:
                return
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def round_done(self, round_index: int, validation_error: float, train_loss: float,
                   epoch: float | None = None, metrics: RoundMetrics | None = None) -> None:
        """Count the round; keep the latest validation error that was measured (not NaN)
        and the round's ``metrics`` among the recent ones (scores left out: they come
        later, and the progress shows none)."""
        with self._lock:
            if metrics is not None:
                self._recent.append(dataclasses.replace(metrics, scores=None))
            self.round = round_index
            self.epoch = epoch
            self.train_loss = None if math.isnan(train_loss) else train_loss
            if not math.isnan(validation_error):
                self.validation_error = validation_error

    def clients_done(self, figures: dict[str, float]) -> None:
        """A run with federated clients: its latest round's fairness figures."""
        with self._lock:
            self.client_figures = dict(figures)

    def unit_discarded(self, reason: str) -> None:
        """A unit was given up after too many failures; ``reason`` is its last failure."""
        with self._lock:
            if self.state == RUNNING:
                self.discarded += 1
                self.discard_reason = reason

    def waiting(self, message: str | None) -> None:
        """Show why a running run waits (too few nodes), or clear it with None."""
        with self._lock:
            if self.state == RUNNING:
                self.message = message

    def end(self, state: str, message: str | None = None) -> None:
        """Mark the run ended; the node summaries are kept as they are at this moment.
        The attempts still out end with the run: they count as cancelled, as the run
        store closes them, and their answers, which may still come, are not counted."""
        nodes = self._node_summaries()
        with self._lock:
            self._final_nodes = nodes
            self.state = state
            self.message = message
            self.cancelled += self.in_flight
            self.in_flight = 0
            self._ended = runtime.monotonic()

    def elapsed(self) -> float:
        with self._lock:
            return (self._ended or runtime.monotonic()) - self._started

    def snapshot(self) -> RunSnapshot:
        frozen = self._final_nodes
        nodes = frozen if frozen is not None else self._node_summaries()
        elapsed = self.elapsed()
        stream = self.stream_counts() if self.stream_counts is not None else {}
        with self._lock:
            return RunSnapshot(
                run_id=self.run_id, state=self.state, round=self.round, rounds=self.rounds,
                validation_error=self.validation_error, units_done=self.units_done,
                units_total=self.units_total, rejected=self.rejected, failed=self.failed,
                in_flight=self.in_flight, elapsed_seconds=elapsed, nodes=nodes,
                message=self.message, stale=self.stale, cancelled=self.cancelled,
                epoch=self.epoch, train_loss=self.train_loss, mode=self.mode,
                model_version=stream.get("version"), pass_index=stream.get("pass"),
                todo=stream.get("todo"), pending=stream.get("pending"), done=stream.get("done"),
                clients=dict(self.client_figures) if self.client_figures else None,
                discarded=self.discarded, discard_reason=self.discard_reason,
                recent_rounds=list(self._recent) or None,
                algorithm=self.algorithm, model=self.model,
            )
