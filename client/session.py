"""Starting a run and following it: train() on one connection, status on another.

`Coordinator.train` blocks for the whole run, so it runs in a background thread
while the main thread polls `status` for progress. If the coordinator stops
answering for `dead_after` seconds the client gives up; Ctrl-C or SIGTERM cancels the run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from client.display import ProgressView
from client.errors import (
    ClientError,
    CoordinatorError,
    CoordinatorFailed,
    UnknownRun,
    coordinator_error,
    interrupted_exit,
    mapped_errors,
    not_a_coordinator,
)
from wire.generated import Coordinator, ttypes
from wire.rpc import ConnectionPool, connect
from wire.version import COORDINATOR_ID

CANCEL_WAIT_SECONDS = 15.0


@dataclass
class Endpoint:
    host: str
    port: int
    connect_timeout: float = 5.0

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


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


def follow_training(endpoint: Endpoint, request: ttypes.TrainRequest, view: ProgressView,
                    poll_seconds: float, dead_after: float) -> ttypes.RunResult:
    """Run train() and show progress until it returns; raises ClientError on failure."""
    info = call(endpoint, "ping", ttypes.PingRequest(protocol_version=request.protocol_version),
                timeout=endpoint.connect_timeout)
    if info.node_id != COORDINATOR_ID:  # compute nodes answer pings too
        raise not_a_coordinator(str(endpoint), info.role)
    train = _TrainCall(endpoint, request)
    try:
        train.start()
        _poll(endpoint, request.run_id, train, view, poll_seconds, dead_after)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (client.errors.Terminated)
        _cancel(endpoint, request.run_id, train, view)
        raise ClientError(f"run {request.run_id} cancelled", exit_code=interrupted_exit(exc)) \
            from None
    return _train_outcome(train, endpoint, request.run_id)


def _poll(endpoint: Endpoint, run_id: str, train: _TrainCall, view: ProgressView,
          poll_seconds: float, dead_after: float) -> None:
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


def attach(endpoint: Endpoint, run_id: str, view: ProgressView, poll_seconds: float,
           dead_after: float) -> ttypes.RunStatus:
    """Follow a run someone else started (or one resumed after a restart) until it ends;
    returns its last status. Ctrl-C only stops following: the run goes on."""
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


def _train_outcome(train: _TrainCall, endpoint: Endpoint, run_id: str) -> ttypes.RunResult:
    if train.error is None:
        return train.result
    error = coordinator_error(train.error, str(endpoint))
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
