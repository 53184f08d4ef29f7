"""wire/handler_errors.py: a served call's exception lets go of the request once answered."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.handler_errors import ReleasingHandler


class Request:
    """Stands for a request whose tensors are views of a whole received frame."""


class Handler:
    def refuse(self, request: Request) -> None:
        try:
            raise KeyError("the model has no such tensor")
        except KeyError as exc:  # chained: this frame keeps `exc`, another cycle
            raise ttypes.InvalidRequest(message="refused") from exc  # immutable


def process(handler: ReleasingHandler, request: Request) -> str:
    """As a generated processor does: the declared exception kept in a local result."""
    result: dict[str, ttypes.InvalidRequest] = {}
    try:
        handler.refuse(request)
    except ttypes.InvalidRequest as refused:
        result["error"] = refused
    return result["error"].message


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counts free memory here: cycles stay until released."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_refused_call_holds_its_request_until_released(no_collector: None) -> None:
    handler = ReleasingHandler(Handler())
    request = Request()
    gone = weakref.ref(request)
    assert process(handler, request) == "refused"
    del request
    assert gone() is not None  # kept alive by the exception's reference cycles
    handler.release()
    assert gone() is None

