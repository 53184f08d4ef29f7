"""The optional shared token: checked on every call a server receives, added to every call sent.

Every request struct of the IDL has `100: optional string token` and every method
declares `Unauthorized`, so the check needs no knowledge of any one service:

* `TokenGuard` wraps a handler; each public method's first argument is the request,
  whose token must equal the server's before the handler sees the call;
* `TokenClient` wraps a generated client and fills in the token of each request
  that has none, on a copy, so the caller's request is never changed.

`wire.rpc` applies both (`ThriftServer(token=...)`, `connect`, `ConnectionPool`);
handlers and callers stay unaware of tokens.
"""

from __future__ import annotations

import copy
import functools
import hmac
import logging
from collections.abc import Callable
from typing import Any

from wire.generated import ttypes

log = logging.getLogger(__name__)

HOW_TO_FIX = ("give every process the same token: --token-file PATH on client.py, "
              "coordinator_node.py and compute_node.py, or the TRAINER_TOKEN environment variable")


def check_token(received: str | None, expected: str) -> None:
    """Raise the declared Unauthorized unless `received` equals `expected`.

    The comparison takes the same time wherever the strings differ, so the
    token cannot be guessed a character at a time from response times.
    """
    if received is None:
        raise ttypes.Unauthorized(message=f"this server requires a token and the call carried "
                                          f"none; {HOW_TO_FIX}")
    if not hmac.compare_digest(received.encode("utf-8"), expected.encode("utf-8")):
        raise ttypes.Unauthorized(message=f"the call's token does not match this server's; "
                                          f"{HOW_TO_FIX}")


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
