"""Starting a run and following it: train() on one connection, status on another.

`Coordinator.train` blocks for the whole run, so it runs in a background thread
while the main thread polls `status` for progress. If the coordinator stops
answering for `dead_after` seconds the client gives up; Ctrl-C or SIGTERM cancels the run.

Given several coordinators (a leader and its standbys, sharing a PostgreSQL run store), the
client talks to the one that leads; when that one dies or loses the lead, the client finds
the next leader, which has taken the run over, and calls train() there again with the same
request: the new leader answers it with the run's result, so the client ends as if nothing
had happened, but for one line saying the coordinator changed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from thrift_trainer.client.display import ProgressView
from thrift_trainer.client.errors import (
    ClientError,
    CoordinatorError,
    CoordinatorFailed,
    CoordinatorUnreachable,
    NotLeader,
    UnknownRun,
    coordinator_error,
    interrupted_exit,
    mapped_errors,
    not_a_coordinator,
)
from thrift_trainer.wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from thrift_trainer.wire.rpc import ConnectionPool, connect
from thrift_trainer.wire.version import COORDINATOR_ID, STANDBY_ROLE

CANCEL_WAIT_SECONDS = 15.0
LEADER_PING_SECONDS = 2.0  # a coordinator that cannot answer a ping this fast is not leading
LEADER_POLL_SECONDS = 0.5  # between rounds of pings while no coordinator leads
SILENCE_BEFORE_LOOKING = 2.0  # the followed coordinator silent this long: does another lead?
MAX_LEADER_CHANGES = 20  # a client follows a run through this many changes of leader


@dataclass
class Endpoint:
    host: str
    port: int
    connect_timeout: float = 5.0

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class LeaderChanged(Exception):
    """The followed coordinator no longer leads (it died, or stands by): find the next."""


@dataclass
class Coordinators:
    """The coordinators a client may call: one, or a leader and its standbys, given as
    libpq takes hosts (`h1,h2 9095`, `h1,h2 9095,9096`)."""

    endpoints: list[Endpoint]

    def __str__(self) -> str:
        return ",".join(map(str, self.endpoints))

    def hosts_and_ports(self) -> str:
        """The two arguments that name these coordinators on the command line."""
        return (",".join(e.host for e in self.endpoints) + " "
                + ",".join(str(e.port) for e in self.endpoints))

    @property
    def several(self) -> bool:
        return len(self.endpoints) > 1

    def leader(self, wait_seconds: float) -> Endpoint:
        """The one that leads. With one address, that one (its calls say what it is); with
        several, each is pinged until one leads, for at most ``wait_seconds``."""
        if not self.several:
            return self.endpoints[0]
        deadline = time.monotonic() + wait_seconds
        while True:
            found, problems = self.find_leader()
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                raise ClientError(f"no coordinator of {self} leads after {wait_seconds:.0f}s: "
                                  + "; ".join(problems))
            time.sleep(LEADER_POLL_SECONDS)  # a standby takes over once the lease expires

    def find_leader(self, besides: Endpoint | None = None) -> tuple[Endpoint | None, list[str]]:
        """One round of pings: the first coordinator that leads (other than ``besides``),
        and what each of the others answered."""
        problems = []
        for endpoint in self.endpoints:
            if endpoint is besides:
                continue
            try:
                info = call(endpoint, "ping", ttypes.PingRequest(
                    protocol_version=PROTOCOL_VERSION), timeout=LEADER_PING_SECONDS)
            except ClientError as exc:
                problems.append(f"{endpoint}: {getattr(exc, 'reason', exc)}")
                continue
            if info.node_id == COORDINATOR_ID and info.role != STANDBY_ROLE:
                return endpoint, problems
            problems.append(f"{endpoint}: " + ("stands by" if info.node_id == COORDINATOR_ID
                                               else "not a coordinator"))
        return None, problems


def call(endpoint: Endpoint, method: str, request: Any, timeout: float = 10.0) -> Any:
    """One short call on a fresh connection; a failure raises a CoordinatorError, whose
    message is the one line the client prints (client.errors)."""
    with (mapped_errors(str(endpoint)),
          connect(Coordinator.Client, endpoint.host, endpoint.port,
                  connect_timeout=endpoint.connect_timeout, read_timeout=timeout) as client):
        return getattr(client, method)(request)


class _TrainCall(threading.Thread):
    """The blocking train() call, its result or exception kept for the main thread."""

    def __init__(self, endpoint: Endpoint, request: ttypes.TrainRequest) -> None:
        super().__init__(name="train-call", daemon=True)
        self.endpoint = endpoint
        self.request = request
        self.result: ttypes.RunResult | None = None
        self.error: BaseException | None = None
        # The coordinator has reported the run: it is stored there, so it can be resumed.
        self.seen = False

    def run(self) -> None:
        try:
            with connect(Coordinator.Client, self.endpoint.host, self.endpoint.port,
                         connect_timeout=self.endpoint.connect_timeout,
                         read_timeout=None) as client:
                self.result = client.train(self.request)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            self.error = exc


def follow_training(coordinators: Coordinators, request: ttypes.TrainRequest,
                    view: ProgressView, poll_seconds: float,
                    dead_after: float) -> ttypes.RunResult:
    """Run train() and show progress until it returns, following the leader from one
    coordinator to the next; raises ClientError on failure."""
    endpoint = coordinators.leader(dead_after)
    for _ in range(MAX_LEADER_CHANGES):
        try:
            return _follow_training(endpoint, coordinators, request, view, poll_seconds,
                                    dead_after)
        except LeaderChanged:
            endpoint = coordinators.leader(dead_after)
            view.note(f"the coordinator changed: following run {request.run_id} at {endpoint}")
    raise ClientError(f"the lead of run {request.run_id} changed {MAX_LEADER_CHANGES} times; "
                      f"follow it with: client.py attach {coordinators.hosts_and_ports()} "
                      f"{request.run_id}")


def _follow_training(endpoint: Endpoint, coordinators: Coordinators,
                     request: ttypes.TrainRequest, view: ProgressView, poll_seconds: float,
                     dead_after: float) -> ttypes.RunResult:
    info = call(endpoint, "ping", ttypes.PingRequest(protocol_version=request.protocol_version),
                timeout=endpoint.connect_timeout)
    if info.node_id != COORDINATOR_ID:  # compute nodes answer pings too
        raise not_a_coordinator(str(endpoint), info.role)
    train = _TrainCall(endpoint, request)
    try:
        train.start()
        _poll(endpoint, request.run_id, train, view, poll_seconds, dead_after, coordinators)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (client.errors.Terminated)
        _cancel(endpoint, request.run_id, train, view)
        raise ClientError(f"run {request.run_id} cancelled", exit_code=interrupted_exit(exc)) \
            from None
    return _train_outcome(train, endpoint, request.run_id, coordinators.several)


def _poll(endpoint: Endpoint, run_id: str, train: _TrainCall, view: ProgressView,
          poll_seconds: float, dead_after: float, coordinators: Coordinators) -> None:
    statuses = ConnectionPool(Coordinator.Client, endpoint.host, endpoint.port,
                              connect_timeout=endpoint.connect_timeout,
                              read_timeout=max(poll_seconds, 5.0))
    last_answer = time.monotonic()
    try:
        while train.is_alive():
            train.join(poll_seconds)
            try:
                with mapped_errors(str(endpoint)), statuses.client() as client:
                    status = client.status(ttypes.StatusRequest(run_id=run_id))
            except UnknownRun:
                last_answer = time.monotonic()  # answered; the run is not registered yet
                continue
            except CoordinatorError as exc:
                _look_for_another_leader(coordinators, endpoint, last_answer)
                if train.is_alive() and time.monotonic() - last_answer > dead_after:
                    hint = _resume_hint(endpoint, run_id, train.seen or None)
                    raise ClientError(f"lost contact with the coordinator at {endpoint} for "
                                      f"{dead_after:.0f}s ({exc.reason}); {hint}") from None
                continue
            view.update(status)
            train.seen = True
            last_answer = time.monotonic()
    finally:
        statuses.close()


def _look_for_another_leader(coordinators: Coordinators, endpoint: Endpoint,
                             last_answer: float) -> None:
    """Raise LeaderChanged when the followed coordinator has been silent a while and
    another one leads now."""
    silent = time.monotonic() - last_answer > SILENCE_BEFORE_LOOKING
    if coordinators.several and silent and coordinators.find_leader(besides=endpoint)[0]:
        raise LeaderChanged


def attach(coordinators: Coordinators, run_id: str, view: ProgressView, poll_seconds: float,
           dead_after: float) -> ttypes.RunStatus:
    """Follow a run someone else started (or one resumed after a restart) until it ends,
    at whichever coordinator leads; returns its last status. Ctrl-C only stops following:
    the run goes on."""
    endpoint = coordinators.leader(dead_after)
    status = call(endpoint, "status", ttypes.StatusRequest(run_id=run_id))
    last_answer = time.monotonic()
    while status.state == "running":
        view.update(status)
        time.sleep(poll_seconds)  # polling interval of a live display, not a wait for an event
        try:
            status = call(endpoint, "status", ttypes.StatusRequest(run_id=status.run_id),
                          timeout=max(poll_seconds, 5.0))
            last_answer = time.monotonic()
        except ClientError as exc:
            try:
                _look_for_another_leader(coordinators, endpoint, last_answer)
            except LeaderChanged:
                endpoint = coordinators.leader(dead_after)
                view.note(f"the coordinator changed: following run {run_id} at {endpoint}")
                continue
            if time.monotonic() - last_answer > dead_after:
                raise ClientError(f"lost contact with the coordinator for {dead_after:.0f}s: "
                                  f"{exc}") from None
    view.update(status)
    return status


def _cancel(endpoint: Endpoint, run_id: str, train: _TrainCall, view: ProgressView) -> None:
    view.note(f"cancelling run {run_id} ...")
    try:
        call(endpoint, "cancel", ttypes.CancelRunRequest(run_id=run_id), timeout=5.0)
    except ClientError as exc:
        view.note(f"could not cancel: {exc}")
        return
    train.join(CANCEL_WAIT_SECONDS)


def _train_outcome(train: _TrainCall, endpoint: Endpoint, run_id: str,
                   others: bool = False) -> ttypes.RunResult:
    """The result, or the error to raise; LeaderChanged when ``others`` (coordinators
    besides this one) may carry the run on: this one stands by, or went away unanswered."""
    if train.error is None:
        return train.result
    error = coordinator_error(train.error, str(endpoint))
    gone = isinstance(error, CoordinatorUnreachable) or (
        isinstance(error, CoordinatorFailed) and not error.answered)
    if others and (isinstance(error, NotLeader) or gone):
        raise LeaderChanged
    if not isinstance(error, CoordinatorFailed):
        raise error  # the run's own end, a refusal, or no coordinator there: its line says it
    stored = train.seen or _is_stored(endpoint, run_id)
    if stored is None and error.answered:
        stored = False  # the coordinator answered the call itself: it refused the run
    raise ClientError(f"the coordinator at {endpoint} dropped the run: {error.reason}; "
                      f"{_resume_hint(endpoint, run_id, stored)}")


def _is_stored(endpoint: Endpoint, run_id: str) -> bool | None:
    """Whether the coordinator knows the run; None when it cannot be asked (it is down)."""
    try:
        call(endpoint, "status", ttypes.StatusRequest(run_id=run_id),
             timeout=endpoint.connect_timeout)
    except UnknownRun:
        return False
    except CoordinatorError:
        return None
    return True


def _resume_hint(endpoint: Endpoint, run_id: str, stored: bool | None) -> str:
    """How to go on: resuming helps only a run the coordinator has stored; when the
    coordinator died before it could say, the hint is conditional."""
    if stored is False:
        return f"the coordinator has no run {run_id}, so there is no run to resume"
    how = (f"restart it with --resume {run_id} and follow the run with: "
           f"client.py attach {endpoint.host} {endpoint.port} {run_id}")
    if stored is None:
        return f"if it had stored run {run_id} before it stopped, {how}"
    return how
