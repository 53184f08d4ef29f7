"""The state of an asynchronous run: passes over the data, versions and the result buffer.

It is the work queue's other settlement (engine/work_queue.py): the round engine's workers
drive it exactly as they drive a round (`round_state`): they take units, start attempts and
report results. The difference is what a result does.
In a round it waits for the barrier; here it goes into a buffer that is full at once
(``async``) or once ``buffer_size`` results are in (``buffered``), and every full buffer
makes a new version of the global model. The stream does not make the version itself: it
hands the buffer to the training loop (coordinator/training_loop.py) as a `VersionDue`,
through the round engine's `stream`, and the loop answers with the new weights
(`applied`). Until it has, no further result is kept and no task is built, so every
result's staleness counts every version made before it, as if the version had been made
at once. Tasks are built from the newest version; a result computed from a version more
than ``max_staleness`` behind is refused as stale and its unit goes back to the front of
the queue, to be computed again from fresh weights.

Units come in PASSES over the data (the algorithm's `plan_pass`): a pass's units wait in
TODO, are PENDING while a node holds them, and are DONE once their result is kept. When
TODO runs empty the next pass starts, while the last units of the previous one may still
be out, so no node waits for a straggler. A unit that fails goes back to the front of
TODO with one failure more, and is discarded for this pass after `max_unit_failures`.

Every ``updates_per_round`` versions make a ROUND, so evaluation, metrics, checkpoints
and ``--rounds`` mean what they mean in sync mode. When a round's last version is made,
the state records a `RoundEnd` for the training loop to write out, and holds further
versions back until the loop says it is written (`round_written`): the checkpoint then
holds exactly that version. The run store records a unit in the round whose version took
its result: at a round's end the units still waiting or computing move on into the next
round, so a resume from a round's checkpoint reopens exactly the units whose results it
does not hold.

A run with federated clients draws them instead of running passes (FedBuff,
engine/client_draws.py): at most `concurrency` clients train at once, each unit is one
client's draw, and a new client is drawn whenever fewer are out (in a private run never
one whose result waits in the buffer: a client counts at most once in a release, whose
version is handed out only once its round is written). A client no live node
holds drops out of the round (neither failed nor discarded) and is not drawn again
for `AWAY_SECONDS` or until the next round, whichever comes first (when every holder is
away no round can end, so a stream whose holders come back must draw their clients again
without one); the round's end lists each client's kept, failed and dropped
units with the version each was applied in or left at (`RoundEnd.clients`).

One re-entrant lock guards it all, and the engine writes the ledger under it
(`recording`), so no attempt is recorded in a round its unit has just left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from thrift_trainer.engine import runtime
from thrift_trainer.engine.client_draws import ClientDraws
from thrift_trainer.engine.ledger import UnitLedger
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.stream_records import (
    ClientEnd,
    RoundEnd,
    StreamPosition,
    TakenUp,
    VersionDue,
    position_of,
    reopened,
)
from thrift_trainer.engine.tasks import TaskResult
from thrift_trainer.engine.work_queue import WAIT_STEP_SECONDS, Kept, RoundFailed, Unit, WorkQueue
from thrift_trainer.training.schedule import ScheduleSettings, weighted
from thrift_trainer.training.units import UnitFailure, UnitResult, UnitSpec, Weights

AWAY_SECONDS = 5.0  # a client that dropped out (no live holder) is not drawn again this long


@dataclass(eq=False)
class StreamUnit(Unit):
    pass_index: int = 1
    ledger_round: int = 1  # the run store's round of the unit: it moves on with the rounds
    planned: bool = False  # entered in the run store (when first taken from TODO)
    kept_as: tuple[int, int, int] | None = None  # (round, sequence, staleness) once kept


@dataclass
class _RoundTally:
    results: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    discarded: list[str] = field(default_factory=list)
    clients: list[ClientEnd] = field(default_factory=list)  # a run with client draws


class StreamState(WorkQueue):
    """The work queue of an asynchronous run, settled by its stream buffer (module
    docstring)."""

    fills_evenly = True  # nodes are filled evenly, and units sent ahead to the least busy

    def __init__(self, *, weights: Weights, first_round: int, last_round: int,
                 updates_per_round: int, schedule: ScheduleSettings,
                 plan_pass: Callable[[int], list[UnitSpec]],
                 scalable: Callable[[str], bool], ledger: UnitLedger, max_attempts: int,
                 position: StreamPosition | None = None,
                 taken_up: list[TakenUp] | None = None,
                 draws: ClientDraws | None = None, private: bool = False) -> None:
        """``position``: where the checkpoint a resumed run starts from left the passes;
        ``taken_up``: the results its first round had kept before, in their order;
        ``draws``: a run with federated clients draws them (module docstring);
        ``private``: a private run's versions are releases (docs/privacy.md): each is
        handed out only once its round is written, and a client counts at most once in
        it."""
        self._lock = runtime.RLock()  # re-entrant: ledger writes nest (see `recording`)
        super().__init__([], max_attempts, self._lock)
        self.units: list[StreamUnit] = []  # unsettled: in TODO or PENDING
        self.weights = weights
        self.round_index = first_round
        self.version = (first_round - 1) * updates_per_round
        self.last_round = last_round
        self.updates_per_round = updates_per_round
        self.schedule = schedule
        self.max_in_flight = 1  # units out at once: the run keeps it at its node count
        self._plan_pass, self._scalable = plan_pass, scalable
        self._ledger = ledger
        self._buffer: list[tuple[UnitResult, float]] = []
        self._due: VersionDue | None = None  # a full buffer the training loop has not applied
        self._taking_up: deque[tuple[UnitResult, int]] = deque()  # (result, staleness)
        self._tally = _RoundTally()
        self._done_in_pass = 0
        self._pass_size = 1  # units a pass plans (known once one starts)
        self._discarded_in_a_row = 0  # units discarded since a result was last kept
        self._leftovers: list[StreamUnit] = []  # settled, with attempts still out
        self.round_end: RoundEnd | None = None  # written by the loop, then round_written()
        self.pass_index = 0
        self._taken_ahead: dict[int, set[str]] = {}  # later passes' units already kept
        self._draws = draws
        self._away: dict[str, float] = {}  # dropped-out client -> when it may be drawn
        self._private = private
        self._released = (first_round, self.version, weights)  # the newest written version
        if position is not None:
            self._reopen(position)
        with self._cond:  # a version it makes due is announced under the lock
            self._take_up(taken_up or [])

    # ----------------------------------------------------------------- passes
    def _reopen(self, position: StreamPosition) -> None:
        """The units a checkpoint did not hold, queued again in pass order."""
        self.pass_index = position.pass_index
        if self._draws is not None:  # each open draw rebuilt from its id
            self._pass_size = self._draws.size()
            for pass_index in sorted(position.open_units):
                self._enqueue(pass_index, [self._draws.spec_of(unit_id)
                                           for unit_id in position.open_units[pass_index]])
            return
        self._pass_size = max(1, len(self._plan_pass(self.pass_index)))  # a whole pass's
        for pass_index, spec in reopened(position, self._plan_pass):
            self._enqueue(pass_index, [spec])

    def _take_up(self, taken_up: list[TakenUp]) -> None:
        """Keep again, in their order, the results kept before the run resumed: the
        versions they made come back as they were made (each as the training loop applies
        the one before: `_keep_taken`), and their units (a later pass's too) are not issued
        again."""
        for taken in taken_up:
            unit = next((u for u in self.units if u.spec.unit_id == taken.unit_id), None)
            if unit is not None:  # open at the checkpoint
                self.units.remove(unit)
                self._queue.remove(unit)
                spec = unit.spec
                self._done_in_pass += taken.pass_index == self.pass_index
            elif self._draws is not None:  # a draw made after the checkpoint
                spec = self._draws.spec_of(taken.unit_id)
                self.pass_index = max(self.pass_index, taken.pass_index)  # ids stay unique
            else:  # of a pass that started after the checkpoint
                spec = next(u for u in self._plan_pass(taken.pass_index)
                            if u.unit_id == taken.unit_id)
                self._taken_ahead.setdefault(taken.pass_index, set()).add(taken.unit_id)
            self._taking_up.append((UnitResult(spec, taken.update, taken.num_samples,
                                               taken.loss, taken.node), taken.staleness))
        self._keep_taken()

    def _keep_taken(self) -> None:
        """Keep the taken-up results up to the next full buffer (under the lock)."""
        while self._taking_up and self._due is None and self.round_end is None:
            self._keep(*self._taking_up.popleft())

    def _start_pass(self) -> None:
        self.pass_index += 1
        specs = self._plan_pass(self.pass_index)
        self._pass_size = max(1, len(specs))
        ahead = self._taken_ahead.pop(self.pass_index, set())
        self._done_in_pass = len(ahead)
        self._enqueue(self.pass_index, [spec for spec in specs if spec.unit_id not in ahead])

    def _enqueue(self, pass_index: int, specs: list[UnitSpec]) -> None:
        for spec in specs:
            unit = StreamUnit(len(self.units), spec, pass_index=pass_index)
            self.units.append(unit)
            self._queue.append(unit)

    def _issue(self, unit: StreamUnit) -> StreamUnit:
        """A unit leaving TODO for the first time enters the run store (in the round in
        progress), so the store holds the units that were sent, not whole passes; one a
        resume reopened is adopted with the attempts it had. A client's draw enters it
        with its first attempt instead: one that drops out (no live holder) was never
        sent, and leaves nothing in the store to carry from round to round."""
        if self._draws is None:
            self._enter(unit)
        return super()._issue(unit)

    def _enter(self, unit: StreamUnit) -> None:
        if not unit.planned:
            earlier = self._ledger.plan_pass_units(self.round_index, unit.pass_index,
                                                   [unit.spec.unit_id])
            unit.attempts = earlier.get(unit.spec.unit_id, 0)
            unit.ledger_round, unit.planned = self.round_index, True

    def start_attempt(self, unit: Unit, node: NodeHandle,
                      on_started: Callable[[int], None] | None = None) -> int | None:
        """A client's draw enters the run store with its first attempt (see `_issue`)."""
        with self._cond:
            if isinstance(unit, StreamUnit) and not (self._over or unit.settled):
                self._enter(unit)
            return super().start_attempt(unit, node, on_started)

    # ------------------------------------------------------------ scheduling
    def _may_issue(self, backups_only: bool) -> bool:
        """A queued unit goes out while fewer than `max_in_flight` are out (with client
        draws: fewer than the clients that train at once)."""
        limit = self.max_in_flight if self._draws is None \
            else self._draws.concurrency(self.max_in_flight)
        return not backups_only and self._in_flight() < limit

    def _refill(self) -> None:
        """TODO is empty: the next pass starts, or the next client is drawn."""
        if self._draws is None:
            self._start_pass()
            return
        spec = self._draws.draw(self.version, self.pass_index + 1, self._busy_clients())
        if spec is not None:
            self.pass_index += 1
            self._pass_size = self._draws.size()
            self._enqueue(self.pass_index, [spec])

    def _busy_clients(self) -> set[str]:
        """Clients not to draw now: training (queued, out, or a leftover attempt still
        computing one) or dropped out of the round."""
        out = [u.spec.client for u in self.units] + \
            [u.spec.client for u in self._leftovers if u.started] + self._buffered_clients()
        now = runtime.monotonic()
        away = {client for client, until in self._away.items() if until > now}
        return {client for client in out if client is not None} | away

    def _buffered_clients(self) -> list[str | None]:
        """Clients whose result waits for a version: drawn again only after it is made, so
        that a client counts at most once in a private run's buffer (its sensitivity)."""
        if not self._private:
            return []
        waiting = [result for result, _ in self._buffer]
        waiting += [result for result, _ in self._taking_up]
        if self._due is not None:
            waiting += self._due.results
        return [result.unit.client for result in waiting]

    def _in_flight(self) -> int:
        return sum(1 for u in self.units if u.reserved or u.started)

    def _may_requeue(self, unit: Unit) -> bool:
        """Unless an attempt of it is out, or it is queued already (a worker that waits
        in `requeue` still holds it, and another may have taken it from the queue
        meanwhile: the unit must not be left to neither)."""
        return not (unit.done or unit.discarded or unit.started) and unit not in self._queue

    def units_per_round(self) -> int:
        return self.updates_per_round * self.schedule.results_per_version

    def newest(self) -> tuple[int, int, Weights]:
        """(round in progress, version, weights) of the newest version, for a new task:
        once the training loop has made the version a full buffer asks for (and, in a
        ``private`` run, once the round it ended is written: a release leaves the
        coordinator only after its checkpoint)."""
        with self._cond:
            if not self._private:
                self._wait_for(self._version_pending)
                return self.round_index, self.version, self.weights
            # a stream that ended or failed meanwhile never writes its last round: the
            # version written before it is what goes out
            self._wait_for(self._loop_busy)
            return self._released

    def ledger_round(self, unit: Unit) -> int:
        """The run store's round that holds ``unit`` now."""
        return unit.ledger_round if isinstance(unit, StreamUnit) else self.round_index

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Held while the engine writes a unit's event to the ledger (see module doc)."""
        with self._lock:
            yield

    def counts(self) -> dict[str, int]:
        """The version, the newest pass and the units: todo (queued), pending (out on
        nodes) and done (of the newest pass)."""
        with self._cond:
            return {"version": self.version, "pass": self.pass_index, "todo": len(self._queue),
                    "pending": self._in_flight(), "done": self._done_in_pass}

    # --------------------------------------------------------------- attempts
    def _after_failure(self, unit: Unit) -> None:
        """A unit discarded after its failures is done with for this pass. A pass's worth
        of units discarded one after another with no result kept between them means that
        no result will ever be kept (every node's is refused, say): the stream fails then,
        as a round whose every unit failed does, instead of passing over the data for
        ever."""
        if unit.dropped and unit in self.units:  # no live holder: out of this round
            self._settle(unit)
            self._note_client(unit, dropped=unit.last_error)
            if unit.spec.client is not None:
                self._away[unit.spec.client] = runtime.monotonic() + AWAY_SECONDS
            return
        if unit.discarded and unit in self.units:  # (once: a unit fails no more after)
            self._settle(unit)
            self._tally.discarded.append(unit.spec.unit_id)
            self._note_client(unit, failed=unit.last_error)
            self._discarded_in_a_row += 1
            if self._discarded_in_a_row >= self._pass_size and self.fatal is None:
                self.fail(RoundFailed(
                    f"the last {self._discarded_in_a_row} units (a pass over the data) all "
                    f"failed and no result was kept; last error: {self.last_error}", []))

    def complete(self, unit: Unit, update: Weights, result: TaskResult,
                 node: str | None = None, on_kept: Callable[[], None] | None = None,
                 on_stale: Callable[[str], None] | None = None) -> bool:
        """Keep a result if its unit is open and it is fresh enough (``on_kept`` records
        it), hand the buffer to the training loop when it is full; a result too stale is
        refused
        (``on_stale`` records why) and its unit queued first to be computed again."""
        with self._cond:
            # Held while a version is made and while a round end is written: a result
            # kept then would count too few versions behind, or belong to the next
            # round (the buffer is always empty when a round ends).
            self._wait_for(self._loop_busy)
            if self.is_over(unit):
                return False
            staleness = self.version - result.model_version
            if staleness > self.schedule.max_staleness:
                if on_stale is not None:
                    on_stale(f"stale: computed from version {result.model_version}, "
                             f"{staleness} behind (max_staleness "
                             f"{self.schedule.max_staleness})")
                if len(unit.started) == 0 and unit not in self._queue:
                    self._queue.appendleft(unit)
                self._cond.notify_all()
                return False
            unit.done = True
            self._settle(unit)
            if on_kept is not None:
                on_kept()
            if isinstance(unit, StreamUnit):
                unit.kept_as = (unit.ledger_round, self._tally.results + len(self._buffer),
                                staleness)
                self._done_in_pass += unit.pass_index == self.pass_index
            self._keep(UnitResult(unit.spec, update, result.num_samples, result.loss, node),
                       staleness)
            self._cond.notify_all()
            return True

    def _keep(self, result: UnitResult, staleness: int) -> None:
        """Buffer a kept result; once the buffer is full it is due as the next version."""
        self._discarded_in_a_row = 0
        self._buffer.append((result, self.schedule.weight(max(staleness, 0))))
        if len(self._buffer) >= self.schedule.results_per_version:
            results = [r for r, _ in self._buffer]
            factors = [f for _, f in self._buffer]
            self._buffer = []
            self._due = VersionDue(self.round_index,
                                   weighted(results, factors, self._scalable))
            self._cond.notify_all()

    def kept(self, unit: Unit, attempt: int, node: str, result: TaskResult) -> Kept:
        """A kept result, with its round, its place among the round's results and its
        staleness: what a resume needs to keep it again in the same order."""
        if not isinstance(unit, StreamUnit) or unit.kept_as is None:
            raise ValueError(f"unit {unit.spec.unit_id} was not kept by this stream")
        round_index, sequence, staleness = unit.kept_as
        return Kept(round_index, unit.spec, attempt, node, result, sequence, staleness)

    def _settle(self, unit: Unit) -> None:
        if unit in self.units:
            self.units.remove(unit)
            if unit.started:  # attempts still out: reclaimed past their deadline as any
                self._leftovers.append(unit)

    def _attempt_holders(self) -> list[Unit]:
        """Open units, and settled ones with attempts still out (a backup's loser whose
        node hangs, say): an attempt that never ends would hold a worker for good."""
        self._leftovers = [u for u in self._leftovers if u.started]
        return self.units + self._leftovers

    # --------------------------------------------------------------- versions
    def _version_pending(self) -> bool:
        """A full buffer (or a taken-up result) waits for the training loop."""
        return self._due is not None or bool(self._taking_up)

    def _loop_busy(self) -> bool:
        """The training loop makes a version or writes a round end."""
        return self.round_end is not None or self._version_pending()

    def _wait_for(self, busy: Callable[[], bool]) -> None:
        """Wait (under the lock) while ``busy``, unless the stream is over or failed."""
        while busy() and not self._over and self.fatal is None:
            self._cond.wait(WAIT_STEP_SECONDS)

    def pending(self) -> VersionDue | RoundEnd | None:
        """What the training loop is to do next: make a version, or write a round's end."""
        with self._cond:
            return self._due or self.round_end

    def applied(self, weights: Weights) -> None:
        """The training loop made the due version: it is the newest now, and the round
        ends with it if it is the round's last."""
        with self._cond:
            due = self._due
            if due is None:
                raise ValueError("no version is due")
            self._due = None
            self.weights = weights
            self.version += 1
            tally = self._tally
            tally.results += len(due.results)
            tally.samples += sum(r.num_samples for r in due.results)
            tally.loss_sum += sum(r.loss * r.num_samples for r in due.results)
            tally.clients += [ClientEnd(self.version, UnitResult(r.unit, {}, r.num_samples,
                                                                 r.loss, r.node))
                              for r in due.results if r.unit.client is not None]
            if self.version >= self.round_index * self.updates_per_round:
                self._end_round()
            self._keep_taken()
            self._cond.notify_all()

    def _end_round(self) -> None:
        tally, ended = self._tally, self.round_index
        self.round_end = RoundEnd(
            round=ended, version=self.version, weights=self.weights, results=tally.results,
            train_loss=tally.loss_sum / tally.samples if tally.samples else float("nan"),
            discarded=list(tally.discarded), position=self._position(),
            clients=list(tally.clients))
        self._tally = _RoundTally()
        self._away = {}  # clients that dropped out may be drawn again
        if ended >= self.last_round:
            self._over = True  # the run's last round: what is still out is left unsettled
            return
        self.round_index = ended + 1
        self._ledger.gather_units(ended - 1, self.round_index,
                                  f"carried on: still to do when round {ended} ended")
        for unit in self.units:
            if unit.planned:
                unit.ledger_round = self.round_index

    def _position(self) -> StreamPosition:
        return position_of(self.pass_index,
                           ((unit.pass_index, unit.spec.unit_id) for unit in self.units))

    def _note_client(self, unit: Unit, failed: str | None = None,
                     dropped: str | None = None) -> None:
        """A client's unit left without a result: its line of the round (the version it
        left at is the newest then)."""
        if unit.spec.client is not None:
            self._tally.clients.append(ClientEnd(
                self.version, None, UnitFailure(unit.spec, failed or dropped or ""),
                dropped=dropped is not None))

    def round_written(self) -> None:
        """The training loop has written the pending `round_end`: versions may move on."""
        with self._cond:
            self.round_end = None
            self._released = (self.round_index, self.version, self.weights)
            self._keep_taken()
            self._cond.notify_all()

    # ------------------------------------------------------------------- end
    def wait_event(self, timeout: float) -> None:
        """Wait until a version is due, a round ends, the run is over or failed, or
        ``timeout`` passes."""
        with self._cond:
            if (self._due is None and self.round_end is None and not self._over
                    and self.fatal is None):
                self._cond.wait(timeout)

