"""How the client fails: the one line it prints, its exit code, and the coordinator's failures.

`coordinator_error` is where the wire's errors of the client's calls to the coordinator
(wire.errors, which maps the Thrift and socket errors) become the client's own exceptions
(`mapped_errors` applies it to a block). Each is a ClientError, so a command that does
not handle one still prints its one line and exits with its code.
"""

from __future__ import annotations

import contextlib
import functools

from thrift_trainer.wire import errors as wire
from thrift_trainer.wire.errors import wire_error
from thrift_trainer.wire.version import MEMBERS_PORT

# Exit codes of the client (docs/usage.md, "Exit codes"): argparse exits 2 on bad arguments.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 3  # the run was cancelled on the coordinator (cancel, another client, shutdown)
EXIT_INTERRUPTED = 130  # Ctrl-C: this client cancelled the run
EXIT_TERMINATED = 143  # SIGTERM (kill): likewise
_RIGHT_PORT = "give the port the coordinator prints as 'coordinator listening on HOST:PORT'"


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: the run this client follows is cancelled."""


def interrupted_exit(exc: KeyboardInterrupt) -> int:
    """The exit code of a client stopped by Ctrl-C or by SIGTERM."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


class ClientError(Exception):
    """A failure the user can act on; the message is the one line the client prints."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CoordinatorError(ClientError):
    """A call to the coordinator failed. The message is the client's line; `reason` is
    the cause alone, for a caller that words its own line around it."""

    def __init__(self, message: str, reason: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message, exit_code)
        self.reason = reason


class CoordinatorUnreachable(CoordinatorError):
    """No connection could be opened: nothing listens there, or the host is down."""


class WrongPeer(CoordinatorError):
    """Something answers at that address, but not the coordinator in our protocol (an HTTP
    server such as the dashboard, a compute node, a TLS mismatch): no retry can help."""


class CoordinatorRefused(CoordinatorError):
    """The coordinator refused the call with an error its service declares (a bad
    request, another protocol version, a wrong token); the message is its own."""


class UnknownRun(CoordinatorRefused):
    """The coordinator has no run of that id (yet)."""


class TrainingFailed(CoordinatorError):
    """The run failed on the coordinator."""


class NotLeader(CoordinatorError):
    """The coordinator stands by for another that shares its run store (or lost the lead
    mid-run); ``leader``: "host:port" of the one that leads, "" when unknown."""

    def __init__(self, message: str, reason: str, leader: str) -> None:
        super().__init__(message, reason)
        self.leader = leader


class RunCancelled(CoordinatorError):
    """The run was cancelled on the coordinator (not by this client's Ctrl-C)."""


class AnswerTooLarge(CoordinatorError):
    """This client refused the coordinator's answer as bigger than it takes (its
    --max-message-mb): no retry can help; the message names the limit and its flag."""


class CoordinatorFailed(CoordinatorError):
    """The call failed on the way (a reset, a timeout) or inside the coordinator.
    `answered`: the coordinator itself answered with the error, so it is up."""

    def __init__(self, message: str, reason: str, answered: bool) -> None:
        super().__init__(message, reason)
        self.answered = answered


def coordinator_error(exc: BaseException, where: str) -> CoordinatorError:
    """The client's exception for a failed call to the coordinator at `where`."""
    if isinstance(exc, CoordinatorError):
        return exc
    error = wire_error(exc)
    if isinstance(error, wire.ConnectionFailed):
        return CoordinatorUnreachable(f"cannot reach the coordinator: {error}", str(error))
    if isinstance(error, wire.ProtocolMismatch):
        return _wrong_protocol(error, where)
    if isinstance(error, wire.UnknownMethod):
        return not_a_coordinator(where)  # of the trainer's servers, only compute nodes
    if isinstance(error, wire.RunFailed):
        return _run_failed(error, where)
    if isinstance(error, wire.RunCancelled):
        return RunCancelled(str(error), str(error), exit_code=EXIT_CANCELLED)
    if isinstance(error, wire.UnknownRun):
        return UnknownRun(str(error), str(error))
    if isinstance(error, wire.TooLargeForPeer):  # the coordinator's limit
        return CoordinatorRefused(f"the coordinator at {where} {error.refusal}", error.refusal)
    if isinstance(error, wire.Refused):  # a bad request is a bad configuration (exit 2)
        return CoordinatorRefused(str(error), str(error), exit_code=EXIT_USAGE
                                  if isinstance(error, wire.BadRequest) else EXIT_FAILURE)
    if isinstance(error, wire.MessageTooLarge):  # this client's own limit
        return AnswerTooLarge(f"this client {error}", str(error))
    return CoordinatorFailed(f"coordinator at {where} failed: {error}", str(error),
                             answered=isinstance(error, wire.RemoteFailure))


def _run_failed(error: wire.RunFailed, where: str) -> CoordinatorError:
    if error.leader is not None:
        return NotLeader(f"the coordinator at {where}: {error}", str(error), error.leader)
    tried = f" (nodes tried: {', '.join(error.nodes_tried)})" if error.nodes_tried else ""
    return TrainingFailed(f"training failed: {error}{tried}", str(error))


def not_a_coordinator(where: str, role: str | None = None) -> WrongPeer:
    """The error of a compute node's port (or a relay's members port, whose ``role`` says
    so) given as the coordinator's."""
    what = role if role and role.startswith(MEMBERS_PORT) else "a compute node"
    return WrongPeer(f"{where} is {what}, not a coordinator; {_RIGHT_PORT}",
                     f"{what} answered")


def _wrong_protocol(exc: wire.ProtocolMismatch, where: str) -> WrongPeer:
    if exc.protocol == "HTTP":
        return WrongPeer(f"{where} is an HTTP server, not the coordinator's Thrift port (the "
                         f"dashboard's port?); {_RIGHT_PORT}", str(exc))
    return WrongPeer(f"cannot talk to the coordinator at {where}: {exc}", str(exc))


def mapped_errors(where: str) -> contextlib.AbstractContextManager[None]:
    """Raise the client's exception for a Thrift or socket error inside the block."""
    return wire.mapped(functools.partial(coordinator_error, where=where))
