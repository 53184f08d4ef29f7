"""The wire's one mapping of a call's errors: each low-level error (socket, TLS, Thrift, a
limit of the chunked messages, an exception the service declares) becomes one class of
wire.errors' tree, named for what a caller decides on."""

from __future__ import annotations

import ssl

import pytest
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TException
from thrift.transport.TTransport import TTransportException

from thrift_trainer.wire import errors
from thrift_trainer.wire.chunks import ChunkSequenceError, MessageRefused, PeerRefusedMessage
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.transport import IdleTimeout, WrongProtocol


@pytest.mark.parametrize(("low_level", "mapped", "message"), [
    (errors.ConnectionFailed("cannot connect to h:1: refused"), errors.ConnectionFailed,
     "cannot connect to h:1: refused"),
    (TimeoutError("timed out"), errors.CallTimedOut, "timed out"),
    (TTransportException(TTransportException.TIMED_OUT, "timed out reading from h:1"),
     errors.CallTimedOut, "timed out reading from h:1"),
    (IdleTimeout("h:1 sent nothing for 60s"), errors.CallTimedOut, "h:1 sent nothing for 60s"),
    (WrongProtocol("HTTP", "h:1 answered in HTTP"), errors.ProtocolMismatch,
     "h:1 answered in HTTP"),
    (MessageRefused("refused a message of 3.0 MiB from h:1"), errors.MessageTooLarge,
     "refused a message of 3.0 MiB from h:1"),
    (ConnectionResetError(104, "Connection reset by peer"), errors.NetworkError,
     "[Errno 104] Connection reset by peer"),
    (ssl.SSLError(1, "bad record mac"), errors.NetworkError, "bad record mac"),
    (TTransportException(TTransportException.END_OF_FILE, "h:1 closed"), errors.NetworkError,
     "h:1 closed"),
    (ChunkSequenceError("chunk 3 of 2"), errors.NetworkError, "chunk 3 of 2"),
    (TProtocolException(TProtocolException.INVALID_DATA, "bad struct"), errors.NetworkError,
     "bad struct"),
    (ttypes.InvalidRequest(message="rounds must be positive"), errors.BadRequest,
     "rounds must be positive"),
    (ttypes.VersionMismatch(message="protocol 9, expected 8", expected=8, received=9),
     errors.WrongVersion, "protocol 9, expected 8"),
    (ttypes.Unauthorized(message="wrong token"), errors.Unauthorized, "wrong token"),
    (PeerRefusedMessage("h:1", 3 * 2**20, "it takes at most 2 MiB"), errors.TooLargeForPeer,
     "h:1 refused a message of 3.0 MiB (3145728 bytes): it takes at most 2 MiB"),
    (TApplicationException(TApplicationException.UNKNOWN_METHOD, "Unknown function train"),
     errors.UnknownMethod, "Unknown function train"),
    (ttypes.RunCancelled(message="run r1 was cancelled"), errors.RunCancelled,
     "run r1 was cancelled"),
    (ttypes.UnknownRun(message="no run 'r1'"), errors.UnknownRun, "no run 'r1'"),
    (TApplicationException(TApplicationException.INTERNAL_ERROR, "Internal error"),
     errors.RemoteFailure, "Internal error"),
    (TApplicationException(TApplicationException.INTERNAL_ERROR), errors.RemoteFailure,
     "Internal error"),
])
def test_each_low_level_error_becomes_one_class_of_the_tree(low_level, mapped, message) -> None:
    error = errors.wire_error(low_level)
    assert type(error) is mapped
    assert str(error) == message
    assert errors.wire_error(error) is error  # mapping twice changes nothing


def test_the_tree_says_whether_the_peer_answered() -> None:
    assert issubclass(errors.ConnectionFailed, errors.TransportError)
    refusals = (errors.BadRequest, errors.WrongVersion, errors.Unauthorized,
                errors.TooLargeForPeer)
    assert all(issubclass(cls, errors.Refused) for cls in refusals)
    assert issubclass(errors.Refused, errors.RemoteError)
    assert not issubclass(errors.MessageTooLarge, errors.RemoteError)  # our own limit


def test_every_exception_the_service_declares_has_its_own_class() -> None:
    declared = [cls for cls in vars(ttypes).values()
                if isinstance(cls, type) and issubclass(cls, TException)
                and cls.__module__ == ttypes.__name__]
    assert len(declared) >= 6
    for cls in declared:
        error = errors.wire_error(cls(message="m"))
        assert type(error) not in (errors.WireError, errors.RemoteFailure), cls
        assert str(error) == "m"


def test_a_refusal_keeps_its_parts_and_a_failed_run_its_fields() -> None:
    too_big = errors.wire_error(PeerRefusedMessage("h:1", 2**20, "its limit"))
    assert too_big.refusal == "refused a message of 1.0 MiB (1048576 bytes): its limit"
    assert errors.wire_error(WrongProtocol("TLS", "h:1 speaks TLS")).protocol == "TLS"
    failed = errors.wire_error(ttypes.TrainingFailed(message="no node", nodes_tried=["a:1"]))
    assert (type(failed), failed.nodes_tried, failed.leader) == (errors.RunFailed, ["a:1"],
                                                                 None)
    standby = errors.wire_error(ttypes.TrainingFailed(message="stands by", leader=""))
    assert (standby.nodes_tried, standby.leader) == ([], "")


class Translated(Exception):
    pass


def test_mapped_translates_a_call_s_errors_from_them_and_passes_the_rest() -> None:
    low_level = ttypes.Unauthorized(message="wrong token")
    with pytest.raises(Translated) as info, errors.mapped(
            lambda exc: Translated(str(errors.wire_error(exc)))):
        raise low_level
    assert str(info.value) == "wrong token" and info.value.__cause__ is low_level
    with pytest.raises(KeyError), errors.mapped(Translated):
        raise KeyError("a bug, not a failed call")
