"""How a node's own calls fail (to the coordinator it registers with, to another node it
sends a session to), in the node's terms.

`call_error` is where the wire's errors of those calls (wire.errors, which maps the
Thrift and socket errors) become the node's own exceptions (`mapped_errors` applies it
to a block); callers decide on the class alone whether to retry, stop or answer "not ok".
"""

from __future__ import annotations

import contextlib

from thrift_trainer.wire.errors import ConnectionFailed, Refused, mapped, wire_error


class CallError(Exception):
    """A call this node made failed; the message is the cause, in one line."""


class PeerUnreachable(CallError):
    """No connection could be opened; the message names host:port."""


class PeerRefused(CallError):
    """The peer answered with a declared refusal (another protocol version, a wrong
    token, a bad request, a message over its limit); no retry can change it. The message
    is the peer's own."""


class CallFailed(CallError):
    """The call failed on the way (a reset, a timeout) or inside the peer."""


def call_error(exc: BaseException) -> CallError:
    """The node's exception for a failed call."""
    if isinstance(exc, CallError):
        return exc
    error = wire_error(exc)
    if isinstance(error, ConnectionFailed):
        return PeerUnreachable(str(error))
    if isinstance(error, Refused):
        return PeerRefused(str(error))
    return CallFailed(str(error))


def mapped_errors() -> contextlib.AbstractContextManager[None]:
    """Raise the node's exception for a Thrift or socket error inside the block."""
    return mapped(call_error)
