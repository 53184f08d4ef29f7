"""How a node's own calls fail (to the coordinator it registers with, to another node it
sends a session to), in the node's terms.

`call_error` is the one place where the Thrift and socket errors of those calls become
the node's own exceptions (`mapped_errors` applies it to a block); callers decide on the
class alone whether to retry, stop or answer "not ok".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from thrift.Thrift import TException

from wire.chunks import PeerRefusedMessage
from wire.generated import ttypes
from wire.rpc import CALL_ERRORS, ConnectionFailed

# The declared refusals of a call: another protocol version, a wrong token, a bad request.
REFUSALS = (ttypes.InvalidRequest, ttypes.VersionMismatch, ttypes.Unauthorized)


class CallError(Exception):
    """A call this node made failed; the message is the cause, in one line."""


class PeerUnreachable(CallError):
    """No connection could be opened; the message names host:port."""


class PeerRefused(CallError):
    """The peer answered with a declared refusal; no retry can change it. The message is
    the peer's own."""


class CallFailed(CallError):
    """The call failed on the way (a reset, a timeout) or inside the peer."""


def call_error(exc: BaseException) -> CallError:
    """The node's exception for a failed call."""
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, ConnectionFailed):
        return PeerUnreachable(str(exc))
    if isinstance(exc, (*REFUSALS, PeerRefusedMessage)):  # the latter: a limit of the peer
        return PeerRefused(exc.message)
    # A TException's own words: the repr of a declared one would print its field names.
    return CallFailed(exc.message if isinstance(exc, TException) and exc.message else str(exc))


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Raise the node's exception for a Thrift or socket error inside the block."""
    try:
        yield
    except CALL_ERRORS as exc:
        raise call_error(exc) from exc
