"""The client's calls to the coordinator: each low-level error becomes the client's own
exception, with the one line it prints and its exit code, in one place."""

from __future__ import annotations

import pytest
from thrift.Thrift import TApplicationException
from thrift.transport.TTransport import TTransportException

from thrift_trainer.client import session
from thrift_trainer.client.errors import (
    EXIT_CANCELLED,
    EXIT_FAILURE,
    EXIT_USAGE,
    AnswerTooLarge,
    ClientError,
    CoordinatorFailed,
    CoordinatorRefused,
    CoordinatorUnreachable,
    RunCancelled,
    TrainingFailed,
    UnknownRun,
    WrongPeer,
    coordinator_error,
    mapped_errors,
)
from thrift_trainer.wire.chunks import MessageRefused, PeerRefusedMessage
from thrift_trainer.wire.errors import ConnectionFailed
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.transport import WrongProtocol

WHERE = "h:9095"
REFUSED = "cannot connect to h:9095: connection refused (is the server running on that port?)"


@pytest.mark.parametrize(("low_level", "mapped", "line"), [
    (ConnectionFailed(REFUSED), CoordinatorUnreachable, f"cannot reach the coordinator: {REFUSED}"),
    (ttypes.UnknownRun(message="no run 'r1'"), UnknownRun, "no run 'r1'"),
    (ttypes.Unauthorized(message="wrong token"), CoordinatorRefused, "wrong token"),
    (ttypes.InvalidRequest(message="rounds must be positive"), CoordinatorRefused,
     "rounds must be positive"),
    (ttypes.VersionMismatch(message="protocol 9, expected 8", expected=8, received=9),
     CoordinatorRefused, "protocol 9, expected 8"),
    (ttypes.TrainingFailed(message="every node failed", nodes_tried=["a:1", "b:2"]),
     TrainingFailed, "training failed: every node failed (nodes tried: a:1, b:2)"),
    (ttypes.TrainingFailed(message="every node failed"), TrainingFailed,
     "training failed: every node failed"),
    (TTransportException(TTransportException.TIMED_OUT, "timed out reading from h:9095"),
     CoordinatorFailed, f"coordinator at {WHERE} failed: timed out reading from h:9095"),
    (TApplicationException(TApplicationException.INTERNAL_ERROR, "Internal error"),
     CoordinatorFailed, f"coordinator at {WHERE} failed: Internal error"),
    (ConnectionResetError(104, "Connection reset by peer"), CoordinatorFailed,
     f"coordinator at {WHERE} failed: [Errno 104] Connection reset by peer"),
    (TApplicationException(TApplicationException.UNKNOWN_METHOD, "Unknown function train"),
     WrongPeer, f"{WHERE} is a compute node, not a coordinator; give the port"),
    (WrongProtocol("HTTP", "h:9095 answered in HTTP"), WrongPeer,
     f"{WHERE} is an HTTP server, not the coordinator's Thrift port"),
    (WrongProtocol("TLS", "h:9095 speaks TLS"), WrongPeer,
     f"cannot talk to the coordinator at {WHERE}: h:9095 speaks TLS"),
    (MessageRefused("refused a message of 3.0 MiB from h:9095: this process takes ..."),
     AnswerTooLarge, "this client refused a message of 3.0 MiB from h:9095: this process "
                     "takes ..."),
    (PeerRefusedMessage("h:9095", 3 * 2**20, "it takes messages of at most 2 MiB (...)"),
     CoordinatorRefused, f"the coordinator at {WHERE} refused a message of 3.0 MiB "
                         "(3145728 bytes): it takes messages of at most 2 MiB (...)"),
])
def test_each_low_level_error_becomes_one_client_exception(low_level, mapped, line) -> None:
    with pytest.raises(mapped) as info, mapped_errors(WHERE):
        raise low_level
    assert str(info.value).startswith(line)
    # a request refused as invalid is a bad configuration (exit 2); the rest are failures
    bad_configuration = isinstance(low_level, ttypes.InvalidRequest)
    assert info.value.exit_code == (EXIT_USAGE if bad_configuration else EXIT_FAILURE)
    assert info.value.__cause__ is low_level
    assert isinstance(info.value, ClientError)  # a command that does not catch it prints it
    assert coordinator_error(info.value, WHERE) is info.value  # mapping twice changes nothing


def test_a_cancelled_run_exits_3_and_an_answered_error_says_the_coordinator_is_up() -> None:
    cancelled = coordinator_error(ttypes.RunCancelled(message="run r1 was cancelled"), WHERE)
    assert isinstance(cancelled, RunCancelled) and cancelled.exit_code == EXIT_CANCELLED
    internal = coordinator_error(TApplicationException(6, "Internal error"), WHERE)
    reset = coordinator_error(ConnectionResetError("reset"), WHERE)
    assert internal.answered and not reset.answered
    assert (internal.reason, reset.reason) == ("Internal error", "reset")


def test_errors_that_are_not_a_call_s_pass_unchanged() -> None:
    with pytest.raises(KeyError), mapped_errors(WHERE):
        raise KeyError("a bug, not a failed call")


def train_call(error: BaseException, seen: bool = False) -> session._TrainCall:
    endpoint = session.Endpoint("h", 9095)
    call = session._TrainCall(endpoint, ttypes.TrainRequest(protocol_version=PROTOCOL_VERSION,
                                                            run_id="r1"))
    call.error, call.seen = error, seen
    return call


@pytest.mark.parametrize(("error", "line", "exit_code"), [
    (ttypes.RunCancelled(message="run r1 was cancelled"), "run r1 was cancelled", 3),
    (ttypes.InvalidRequest(message="unknown model 'x'"), "unknown model 'x'", 2),
    (ConnectionFailed(REFUSED), f"cannot reach the coordinator: {REFUSED}", 1),
])
def test_a_train_call_that_ended_without_dropping_the_run_says_why(error, line,
                                                                    exit_code) -> None:
    call = train_call(error)
    with pytest.raises(ClientError) as info:
        session._train_outcome(call, call.endpoint, "r1")
    assert (str(info.value), info.value.exit_code) == (line, exit_code)


@pytest.mark.parametrize(("error", "follows"), [
    (ttypes.TrainingFailed(message="stands by", leader="h2:9096"), True),
    (ttypes.TrainingFailed(message="stands by", leader=""), True),  # nobody leads yet
    (ConnectionFailed(REFUSED), True),
    (TTransportException(TTransportException.END_OF_FILE, "h:9095 closed"), True),
    (TApplicationException(6, "Internal error"), False),  # it answered: it is up
    (ttypes.TrainingFailed(message="no node answered"), False),  # the run's own end
])
def test_with_other_coordinators_a_lost_or_standby_leader_is_followed(error, follows) -> None:
    call = train_call(error)
    with pytest.raises(session.LeaderChanged if follows else ClientError):
        session._train_outcome(call, call.endpoint, "r1", others=True)
    if follows:  # alone, the same error ends the client with its line
        with pytest.raises(ClientError):
            session._train_outcome(call, call.endpoint, "r1", others=False)


def test_a_standby_s_refusal_says_who_leads() -> None:
    error = coordinator_error(ttypes.TrainingFailed(message="run r1 was not started: this "
                                                    "coordinator stands by (h2:9096 leads)",
                                                    leader="h2:9096"), WHERE)
    assert (type(error).__name__, error.leader) == ("NotLeader", "h2:9096")
    assert "stands by (h2:9096 leads)" in str(error)


def test_a_dropped_run_is_resumable_only_where_the_coordinator_may_have_stored_it(
        monkeypatch) -> None:
    monkeypatch.setattr(session, "_is_stored", lambda endpoint, run_id: None)  # it is down
    answered = train_call(TApplicationException(6, "Internal error"))
    with pytest.raises(ClientError, match="dropped the run: Internal error; the coordinator "
                                          "has no run r1, so there is no run to resume"):
        session._train_outcome(answered, answered.endpoint, "r1")
    lost = train_call(TTransportException(TTransportException.END_OF_FILE, "h:9095 closed"))
    with pytest.raises(ClientError, match="dropped the run: h:9095 closed; if it had stored "
                                          "run r1 before it stopped, restart it with --resume"):
        session._train_outcome(lost, lost.endpoint, "r1")
