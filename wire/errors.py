"""How a call over the wire fails: one tree of exceptions, and the one place that maps
the low-level errors of a call to it.

A call made through `wire.rpc` can fail with a socket error, a Thrift transport or
application error, a limit of `wire.chunks`, or an exception the service declares in
thrift/trainer.thrift. `wire_error` turns each into one class of this tree, named for
what a caller decides on; the client, the coordinator's node clients and a node's own
calls then put the class into their own terms (client.errors, engine.nodes.thrift_client,
compute_node.call_errors) without looking at Thrift again. `mapped` applies such a
translation to a block.

    WireError                a call failed; str(): the cause, in one line
    ├── TransportError       the call failed on the way: no answer came back
    │   ├── ConnectionFailed no connection could be opened (the message names host:port)
    │   ├── CallTimedOut     the peer took the call and did not answer in time
    │   ├── ProtocolMismatch something answers there, but not in framed Thrift
    │   ├── MessageTooLarge  this process refused the peer's message: its own limit
    │   └── NetworkError     the connection broke or carried garbage (reset, closed)
    └── RemoteError          the peer answered with an error
        ├── Refused          a declared refusal: no retry can change it
        │   ├── BadRequest       the request is wrong (InvalidRequest)
        │   ├── WrongVersion     another protocol version (VersionMismatch)
        │   ├── Unauthorized     no token, or a wrong one
        │   └── TooLargeForPeer  the peer refused this process's message: its limit
        ├── UnknownMethod    the peer serves another service
        ├── RunFailed        the run could not finish (TrainingFailed)
        ├── RunCancelled     the run was cancelled
        ├── UnknownRun       no run of that id
        └── RemoteFailure    any other error the peer answered (an internal error)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TException
from thrift.transport.TTransport import TTransportException

from thrift_trainer.wire.chunks import MessageRefused, PeerRefusedMessage
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.transport import WrongProtocol


class WireError(Exception):
    """A call failed; the message is the cause, in one line."""


class TransportError(WireError):
    """The call failed on the way: no answer of the peer came back."""


class ConnectionFailed(TransportError):
    """A connection could not be opened; the message names host:port and the cause."""


class CallTimedOut(TransportError):
    """The peer took the call and did not answer in time."""


class ProtocolMismatch(TransportError):
    """Something answers at that address, but not in framed Thrift (``protocol``: "HTTP"
    or "TLS"): the wrong port, or one side lacks a TLS setting."""

    def __init__(self, message: str, protocol: str) -> None:
        super().__init__(message)
        self.protocol = protocol


class MessageTooLarge(TransportError):
    """This process refused the peer's message as bigger than it takes (--max-message-mb):
    the limit is this process's own."""


class NetworkError(TransportError):
    """The connection broke or carried something undecodable (a reset, a close mid-call,
    a malformed frame)."""


class RemoteError(WireError):
    """The peer answered the call with an error."""


class Refused(RemoteError):
    """The peer refused the call with a declared refusal: no retry can change it. The
    message is the peer's own."""


class BadRequest(Refused):
    """The request is wrong; the message says how to fix it."""


class WrongVersion(Refused):
    """The peer speaks another protocol version: no call to it can succeed."""


class Unauthorized(Refused):
    """The call lacked the token the peer requires, or carried a wrong one."""


class TooLargeForPeer(Refused):
    """The peer refused a message of this process as bigger than it takes. The message
    names the peer; ``refusal`` is the rest, for a caller that names the peer itself."""

    def __init__(self, message: str, refusal: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class UnknownMethod(RemoteError):
    """The peer does not serve the method: it is another of the trainer's services."""


class RunFailed(RemoteError):
    """The run could not finish. ``nodes_tried``: "host:port" of each node tried;
    ``leader``, when not None: the peer does not lead its run store, and the run goes on
    at that "host:port" ("" when unknown)."""

    def __init__(self, message: str, nodes_tried: list[str], leader: str | None) -> None:
        super().__init__(message)
        self.nodes_tried = nodes_tried
        self.leader = leader


class RunCancelled(RemoteError):
    """The run was cancelled before it finished."""


class UnknownRun(RemoteError):
    """The peer has no run of that id."""


class RemoteFailure(RemoteError):
    """The peer answered with an error it does not declare (an internal error)."""


# What a call over `wire.rpc` can raise: no connection, an error on the way (a reset, a
# timeout: TTransportException or OSError), or the peer's answer of an error
# (TApplicationException, or an exception the service declares: all TExceptions).
CALL_ERRORS = (ConnectionFailed, TException, OSError)

# The service's declared exceptions that carry nothing but their message.
_DECLARED: dict[type[TException], type[RemoteError]] = {
    ttypes.InvalidRequest: BadRequest,
    ttypes.VersionMismatch: WrongVersion,
    ttypes.Unauthorized: Unauthorized,
    ttypes.RunCancelled: RunCancelled,
    ttypes.UnknownRun: UnknownRun,
}


def wire_error(exc: BaseException) -> WireError:
    """The class of the tree for a call's error (itself when it is one already)."""
    if isinstance(exc, WireError):
        return exc
    if isinstance(exc, TApplicationException):
        if exc.type == TApplicationException.UNKNOWN_METHOD:
            return UnknownMethod(_cause(exc))
        return RemoteFailure(_cause(exc))
    if isinstance(exc, TTransportException):
        return _transport_error(exc)
    if isinstance(exc, TException):
        return _declared_error(exc)
    if isinstance(exc, TimeoutError):
        return CallTimedOut(str(exc))
    if isinstance(exc, OSError):
        return NetworkError(str(exc))
    return WireError(str(exc))


def _transport_error(exc: TTransportException) -> WireError:
    if isinstance(exc, PeerRefusedMessage):  # the peer's answer to our announcement
        return TooLargeForPeer(_cause(exc), exc.refusal)
    if isinstance(exc, MessageRefused):
        return MessageTooLarge(_cause(exc))
    if isinstance(exc, WrongProtocol):
        return ProtocolMismatch(_cause(exc), exc.protocol)
    if exc.type == TTransportException.TIMED_OUT:
        return CallTimedOut(_cause(exc))
    return NetworkError(_cause(exc))


def _declared_error(exc: TException) -> WireError:
    if isinstance(exc, ttypes.TrainingFailed):
        return RunFailed(_cause(exc), list(exc.nodes_tried or []), exc.leader)
    if isinstance(exc, TProtocolException):  # an answer that cannot be decoded
        return NetworkError(_cause(exc))
    for cls in type(exc).__mro__:
        if cls in _DECLARED:
            return _DECLARED[cls](_cause(exc))
    return RemoteFailure(_cause(exc))  # declared, but not in this table


def _cause(exc: TException) -> str:
    """A TException's own words: the str of a declared one would print its field names."""
    return exc.message if exc.message else str(exc)


@contextlib.contextmanager
def mapped(translate: Callable[[BaseException], Exception]) -> Iterator[None]:
    """Raise ``translate(exc)``, chained from it, for a call's error inside the block;
    other errors (bugs) pass unchanged. ``translate`` is a caller's own mapping, which
    starts from `wire_error`."""
    try:
        yield
    except CALL_ERRORS as exc:
        raise translate(exc) from exc
