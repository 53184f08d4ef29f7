"""A served call's exception lets go of the call's memory once its answer is written.

A generated processor answers a declared exception (InvalidRequest, say) by keeping it in
its result struct, a local variable of the very frame that the exception's traceback
holds: a reference cycle. An exception chained from another (`raise ... from exc`) adds
one more, since the frame that caught the first keeps it as a local. Through those frames
the cycle holds the call's arguments, whose tensors are views of the whole received frame,
and whatever the handler built from them, until the garbage collector happens to run:
requests refused as invalid, one after another, could keep gigabytes alive.

`ReleasingHandler` wraps a service handler and remembers, per thread, the exception a call
raised; `release()`, called by the server once the answer is written, clears the frames of
that exception's tracebacks (and of those it was chained from), which breaks the cycles.
"""

from __future__ import annotations

import copy
import functools
import threading
import traceback
from collections.abc import Callable
from typing import Any

MAX_CHAIN = 16  # exceptions followed through __cause__ and __context__


class ReleasingHandler:
    """A handler whose public methods remember the exception they raise on this thread."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler
        self._raised = threading.local()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handler, name)
        if name.startswith("_") or not callable(attr):
            return attr
        return self._remembering(attr)

    def _remembering(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except BaseException as exc:
                self._raised.exception = exc
                raise

        return call

    def release(self) -> None:
        """Let go of what the last call on this thread raised, once it was answered."""
        exception = getattr(self._raised, "exception", None)
        self._raised.exception = None
        for _ in range(MAX_CHAIN):
            if exception is None:
                return
            if exception.__traceback__ is not None:
                traceback.clear_frames(exception.__traceback__)
                # with_traceback, not an assignment: Thrift's exceptions are immutable
                exception.with_traceback(None)
            exception = exception.__cause__ or exception.__context__


def releasing_processor(processor: Any) -> tuple[Any, ReleasingHandler]:
    """A copy of a generated Processor whose handler is wrapped in a ReleasingHandler (the
    caller's processor is left as it is), and that handler."""
    if not hasattr(processor, "_handler"):
        raise TypeError(f"{processor!r} is not a Thrift-generated Processor")
    releasing = copy.copy(processor)
    releasing._handler = handler = ReleasingHandler(processor._handler)
    return releasing, handler
