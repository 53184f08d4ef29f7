"""The optional shared token: checked on every call a server receives, added to every call sent.

Every request struct of the IDL has `100: optional string token` and every method
declares `Unauthorized`, so the check needs no knowledge of any one service:

* `TokenGuard` wraps a handler; each public method's first argument is the request,
  whose token must equal the server's before the handler sees the call;
* `TokenClient` wraps a generated client and fills in the token of each request
  that has none, on a copy, so the caller's request is never changed.

* `RequestGate` checks the token of each request while it is still raw bytes (see
  `wire.frame_scan`), so a request without the token is answered Unauthorized
  before anything of it is decoded; a connection whose request passed is marked
  authenticated, which lets its transport receive big frames the fast way.

`wire.rpc` applies them (`ThriftServer(token=...)`, `connect`, `ConnectionPool`);
handlers and callers stay unaware of tokens.
"""

from __future__ import annotations

import copy
import functools
import hmac
import logging
import sys
from collections.abc import Callable
from typing import Any

from thrift.protocol.TProtocol import TProtocolBase, TProtocolException
from thrift.Thrift import TApplicationException, TMessageType

from thrift_trainer.wire import frame_scan
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.transport import FramedSocketTransport

log = logging.getLogger(__name__)

NO_TOKEN = "this server requires a token and the call carried none"
WRONG_TOKEN = "the call's token does not match this server's"
HOW_TO_FIX = ("give every process the same token: --token-file PATH on client.py, "
              "coordinator_node.py and compute_node.py, or the TRAINER_TOKEN environment variable")


def check_token(received: str | None, expected: str) -> None:
    """Raise the declared Unauthorized unless `received` equals `expected`.

    The comparison takes the same time wherever the strings differ, so the
    token cannot be guessed a character at a time from response times.
    """
    if received is None:
        raise ttypes.Unauthorized(message=f"{NO_TOKEN}; {HOW_TO_FIX}")
    if not hmac.compare_digest(received.encode("utf-8"), expected.encode("utf-8")):
        raise ttypes.Unauthorized(message=f"{WRONG_TOKEN}; {HOW_TO_FIX}")


class TokenGuard:
    """A handler whose public methods first check the token of their request argument."""

    def __init__(self, handler: Any, token: str) -> None:
        if not token:
            raise ValueError("a TokenGuard needs a non-empty token")
        self._handler = handler
        self._token = token

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handler, name)
        if name.startswith("_") or not callable(attr):
            return attr
        return self._guarded(name, attr)

    def _guarded(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def checked(request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                check_token(getattr(request, "token", None), self._token)
            except ttypes.Unauthorized:
                log.warning("refused a %s call: missing or wrong token", name)
                raise
            return method(request, *args, **kwargs)

        return checked


def guard_processor(processor: Any, token: str) -> Any:
    """A copy of a generated Processor whose handler is wrapped in a TokenGuard.

    Generated processors keep their handler in `_handler` and look methods up
    on it for each call; the copy leaves the caller's processor unguarded.
    """
    if not hasattr(processor, "_handler"):
        raise TypeError(f"{processor!r} is not a Thrift-generated Processor")
    guarded = copy.copy(processor)
    guarded._handler = TokenGuard(processor._handler, token)
    return guarded


class TokenClient:
    """A generated client that sends `token` with every request lacking one.

    Other attributes (the protocol in `_iprot`, `send_*`/`recv_*`) pass through.
    """

    def __init__(self, client: Any, token: str) -> None:
        self.wrapped = client
        self._token = token

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.wrapped, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        def with_token(*args: Any, **kwargs: Any) -> Any:
            if args:
                args = (_stamped(args[0], self._token), *args[1:])
            return attr(*args, **kwargs)

        return with_token


def unwrap(client: Any) -> Any:
    """The generated client under a TokenClient (or `client` itself)."""
    return client.wrapped if isinstance(client, TokenClient) else client


def _stamped(request: Any, token: str) -> Any:
    """`request` with `token` set, copied (shallowly: tensors are shared) when it had none."""
    if not hasattr(request, "token") or request.token is not None:
        return request  # not a request struct, or a token chosen by the caller
    stamped = copy.copy(request)
    stamped.token = token
    return stamped


class RequestGate:
    """Checks each request's token in its raw frame, before the processor decodes it."""

    def __init__(self, processor: Any, token: str) -> None:
        if not token:
            raise ValueError("a RequestGate needs a non-empty token")
        self._service = sys.modules[type(processor).__module__]  # has the <method>_result
        self._token = token.encode("utf-8")

    def admit(self, transport: FramedSocketTransport, protocol: TProtocolBase) -> bool:
        """Whether the next request carries the token; if not, it is answered
        Unauthorized and dropped unread. Malformed frames raise TProtocolException."""
        try:
            call = frame_scan.scan_call(transport.current_frame())
        except frame_scan.ScanError as exc:
            raise TProtocolException(TProtocolException.INVALID_DATA,
                                     f"malformed request from {transport.peer}: {exc}") from None
        if call.token is not None and hmac.compare_digest(call.token, self._token):
            transport.authenticated = True
            return True
        transport.skip_frame()
        log.warning("refused a %s call from %s: missing or wrong token", call.method[:64],
                    transport.peer)
        self._refuse(call, protocol)
        return False

    def _refuse(self, call: frame_scan.CallHead, protocol: TProtocolBase) -> None:
        message = f"{NO_TOKEN if call.token is None else WRONG_TOKEN}; {HOW_TO_FIX}"
        result_cls = getattr(self._service, f"{call.method}_result", None)
        field = _unauthorized_field(result_cls)
        if field is None:  # not a method of this service: answer as the processor would
            protocol.writeMessageBegin(call.method, TMessageType.EXCEPTION, call.seqid)
            TApplicationException(TApplicationException.UNKNOWN_METHOD,
                                  f"unknown method {call.method[:64]!r}").write(protocol)
        else:
            result = result_cls()
            setattr(result, field, ttypes.Unauthorized(message=message))
            protocol.writeMessageBegin(call.method, TMessageType.REPLY, call.seqid)
            result.write(protocol)
        protocol.writeMessageEnd()
        protocol.trans.flush()


def _unauthorized_field(result_cls: Any) -> str | None:
    """The name of the Unauthorized field of a generated `<method>_result`, if any."""
    for spec in getattr(result_cls, "thrift_spec", None) or ():
        if spec is not None and spec[3] is not None and spec[3][0] is ttypes.Unauthorized:
            return spec[2]
    return None
