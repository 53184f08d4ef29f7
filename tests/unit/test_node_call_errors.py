"""A node's own calls: each low-level error becomes the node's exception in one place, and
the coordinator link and the session send decide on the class alone."""

from __future__ import annotations

import pytest
from thrift.Thrift import TApplicationException
from thrift.transport.TTransport import TTransportException

from thrift_trainer.compute_node import coordinator_link, session_service
from thrift_trainer.compute_node.call_errors import (
    CallFailed,
    PeerRefused,
    PeerUnreachable,
    call_error,
    mapped_errors,
)
from thrift_trainer.compute_node.coordinator_link import CoordinatorLink, PullSettings, PullStopped
from thrift_trainer.wire.chunks import PeerRefusedMessage
from thrift_trainer.wire.errors import ConnectionFailed
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes

UNREACHABLE = ConnectionFailed("cannot connect to h:1: connection refused")


@pytest.mark.parametrize(("low_level", "mapped", "message"), [
    (UNREACHABLE, PeerUnreachable, "cannot connect to h:1: connection refused"),
    (ttypes.VersionMismatch(message="protocol 9, expected 8", expected=8, received=9),
     PeerRefused, "protocol 9, expected 8"),
    (ttypes.Unauthorized(message="wrong token"), PeerRefused, "wrong token"),
    (ttypes.InvalidRequest(message="no run 'r'"), PeerRefused, "no run 'r'"),
    (TTransportException(TTransportException.TIMED_OUT, "timed out reading from h:1"),
     CallFailed, "timed out reading from h:1"),
    (TApplicationException(TApplicationException.INTERNAL_ERROR, "Internal error"),
     CallFailed, "Internal error"),
    (ConnectionResetError(104, "Connection reset by peer"), CallFailed,
     "[Errno 104] Connection reset by peer"),
    (ttypes.UnknownRun(message="no run 'r'"), CallFailed, "no run 'r'"),
    (PeerRefusedMessage("h:1", 3 * 2**20, "it takes messages of at most 2 MiB (...)"),
     PeerRefused, "h:1 refused a message of 3.0 MiB (3145728 bytes): it takes messages of "
                  "at most 2 MiB (...)"),
])
def test_each_low_level_error_becomes_one_node_exception(low_level, mapped, message) -> None:
    with pytest.raises(mapped) as info, mapped_errors():
        raise low_level
    assert str(info.value) == message
    assert info.value.__cause__ is low_level
    assert call_error(info.value) is info.value  # mapping twice changes nothing


def test_errors_that_are_not_a_call_s_pass_unchanged() -> None:
    with pytest.raises(KeyError), mapped_errors():
        raise KeyError("a bug, not a failed call")


class FailingConnect:
    """Stands for `connect`: every call fails with `error` (no socket)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def __call__(self, *args, **kwargs) -> FailingConnect:
        self.calls += 1
        return self

    def __enter__(self):
        raise self.error

    def __exit__(self, *exc: object) -> None:
        return None


def link(retry_for: float = 300.0) -> CoordinatorLink:
    return CoordinatorLink(handler=None, settings=PullSettings(
        "coordinator", 9095, "n1", 0.0, retry_for=retry_for))


def register(target: CoordinatorLink) -> None:
    target._call("register_node", lambda: ttypes.RegisterRequest(
        protocol_version=PROTOCOL_VERSION, node_id="n1", pull=True))


def test_a_refusal_stops_the_node_at_once(monkeypatch) -> None:
    fake = FailingConnect(ttypes.Unauthorized(message="wrong token"))
    monkeypatch.setattr(coordinator_link, "connect", fake)
    with pytest.raises(PullStopped, match="^the coordinator refused this node: wrong token$"):
        register(link())
    assert fake.calls == 1


def test_an_unreachable_coordinator_is_retried_until_retry_for(monkeypatch) -> None:
    fake = FailingConnect(UNREACHABLE)
    monkeypatch.setattr(coordinator_link, "connect", fake)
    monkeypatch.setattr(coordinator_link, "RETRY_FIRST_SECONDS", 0.001)
    with pytest.raises(PullStopped, match="coordinator:9095 unreachable for 0s: cannot connect"):
        register(link(retry_for=0.01))
    assert fake.calls >= 2


def test_a_call_without_retry_raises_the_node_exception(monkeypatch) -> None:
    monkeypatch.setattr(coordinator_link, "connect", FailingConnect(UNREACHABLE))
    target = link()
    with pytest.raises(PeerUnreachable):
        target._call("leave", lambda: None, retry=False)
    target.stopped.set()  # a stopping node gives up a failing call as stopped
    with pytest.raises(PullStopped, match="^stopped$"):
        register(target)


@pytest.mark.parametrize(("error", "message"), [
    (ttypes.InvalidRequest(message="no such swap"), "n2:7 refused: no such swap"),
    (ttypes.VersionMismatch(message="protocol 9", expected=8, received=9),
     "n2:7 refused: protocol 9"),
    (TimeoutError("timed out"), "cannot reach n2:7: timed out"),
])
def test_a_send_that_fails_answers_not_ok_with_the_reason(monkeypatch, error, message) -> None:
    monkeypatch.setattr(session_service, "connect", FailingConnect(error))
    service = session_service.SessionService()
    monkeypatch.setattr(service, "_exported", lambda run_id, name: [])
    ack = service.send_session(ttypes.SendSessionRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", session="d0", target_host="n2",
        target_port=7, target_session="d1", swap_id=1))
    assert not ack.ok and ack.message == message
