"""Starting a run and following it: train() on one connection, status on another.

`Coordinator.train` blocks for the whole run, so it runs in a background thread
while the main thread polls `status` for progress. If the coordinator stops
answering for `dead_after` seconds the client gives up; Ctrl-C cancels the run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from thrift.Thrift import TApplicationException, TException

from client.display import ProgressView
from wire.generated import Coordinator, ttypes
from wire.rpc import ConnectionFailed, ConnectionPool, connect
from wire.transport import WrongProtocol
from wire.version import COORDINATOR_ID

CANCEL_WAIT_SECONDS = 15.0
# Exit codes of the client (README, "Exit codes"): argparse itself exits 2 on bad arguments.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 3  # the run was cancelled on the coordinator (cancel, another client, shutdown)
EXIT_INTERRUPTED = 130  # Ctrl-C: this client cancelled the run


class ClientError(Exception):
    """A failure the user can act on; the message is the one line the client prints."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Endpoint:
    host: str
    port: int
    connect_timeout: float = 5.0

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def call(endpoint: Endpoint, method: str, request: Any, timeout: float = 10.0) -> Any:
    """One short call on a fresh connection, with errors turned into one-line ClientErrors."""
    try:
        with connect(Coordinator.Client, endpoint.host, endpoint.port,
                     connect_timeout=endpoint.connect_timeout, read_timeout=timeout) as client:
            return getattr(client, method)(request)
    except ConnectionFailed as exc:
        raise ClientError(f"cannot reach the coordinator: {exc}") from None
    except (ttypes.UnknownRun, ttypes.Unauthorized) as exc:
        raise ClientError(exc.message) from None
    except WrongProtocol as exc:
        raise _wrong_port(endpoint, exc) from None
    except TApplicationException as exc:
        if exc.type == TApplicationException.UNKNOWN_METHOD:
            # Of the trainer's servers, only compute nodes lack the coordinator's calls.
            raise _not_a_coordinator(endpoint) from None
        raise ClientError(f"coordinator at {endpoint} failed: {exc}") from None
    except (TException, OSError) as exc:
        raise ClientError(f"coordinator at {endpoint} failed: {exc}") from None


def _wrong_port(endpoint: Endpoint, exc: WrongProtocol) -> ClientError:
    if exc.protocol == "HTTP":
        return ClientError(f"{endpoint} is an HTTP server, not the coordinator's Thrift port "
                           "(the dashboard's port?); give the port the coordinator prints as "
                           "'coordinator listening on HOST:PORT'")
    return ClientError(f"cannot talk to the coordinator at {endpoint}: {exc}")


def _not_a_coordinator(endpoint: Endpoint) -> ClientError:
    return ClientError(f"{endpoint} is a compute node, not a coordinator; give the port the "
                       "coordinator prints as 'coordinator listening on HOST:PORT'")


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
        raise _not_a_coordinator(endpoint)
    train = _TrainCall(endpoint, request)
    try:
        train.start()
        _poll(endpoint, request.run_id, train, view, poll_seconds, dead_after)
    except KeyboardInterrupt:
        _cancel(endpoint, request.run_id, train, view)
        raise ClientError(f"run {request.run_id} cancelled", exit_code=EXIT_INTERRUPTED) \
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
                with statuses.client() as client:
                    view.update(client.status(ttypes.StatusRequest(run_id=run_id)))
                train.seen = True
                last_answer = time.monotonic()
            except ttypes.UnknownRun:
                last_answer = time.monotonic()  # answered; the run is not registered yet
            except (ConnectionFailed, TException, OSError) as exc:
                if train.is_alive() and time.monotonic() - last_answer > dead_after:
                    hint = _resume_hint(endpoint, run_id, train.seen or None)
                    raise ClientError(f"lost contact with the coordinator at {endpoint} for "
                                      f"{dead_after:.0f}s ({exc}); {hint}") from None
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
    error = train.error
    if error is None and train.result is not None:
        return train.result
    if isinstance(error, ttypes.TrainingFailed):
        tried = f" (nodes tried: {', '.join(error.nodes_tried)})" if error.nodes_tried else ""
        raise ClientError(f"training failed: {error.message}{tried}")
    if isinstance(error, ttypes.RunCancelled):
        raise ClientError(error.message, exit_code=EXIT_CANCELLED)
    if isinstance(error, (ttypes.InvalidRequest, ttypes.VersionMismatch, ttypes.Unauthorized)):
        raise ClientError(error.message)
    if isinstance(error, ConnectionFailed):
        raise ClientError(f"cannot reach the coordinator: {error}")
    stored = train.seen or _is_stored(endpoint, run_id)
    if stored is None and isinstance(error, TApplicationException):
        stored = False  # the coordinator answered the call itself: it refused the run
    raise ClientError(f"the coordinator at {endpoint} dropped the run: {error}; "
                      f"{_resume_hint(endpoint, run_id, stored)}")


def _is_stored(endpoint: Endpoint, run_id: str) -> bool | None:
    """Whether the coordinator knows the run; None when it cannot be asked (it is down)."""
    try:
        with connect(Coordinator.Client, endpoint.host, endpoint.port,
                     connect_timeout=endpoint.connect_timeout,
                     read_timeout=endpoint.connect_timeout) as client:
            client.status(ttypes.StatusRequest(run_id=run_id))
    except ttypes.UnknownRun:
        return False
    except (ConnectionFailed, TException, OSError):
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
