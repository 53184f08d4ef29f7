"""What a node and the client say when the address they dial on loopback has nothing
listening."""

from __future__ import annotations

import pytest
from thrift.Thrift import TApplicationException

from tests.integration.test_node_client import closed_port
from tests.unit.test_coordinator_handler import train_request
from tests.unit.test_node_sessions import State, handler
from thrift_trainer.client import session
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes


def test_a_send_to_an_unreachable_node_answers_not_ok_with_the_reason() -> None:
    node = handler()
    with node.sessions.use("r", "d0") as node_session:
        node_session.state = State(1.0)
    port = closed_port()
    ack = node.send_session(ttypes.SendSessionRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", session="d0", target_host="127.0.0.1",
        target_port=port, target_session="d1", swap_id=1))
    assert not ack.ok and f"cannot reach 127.0.0.1:{port}" in ack.message


def test_the_client_suggests_resume_only_for_a_run_the_coordinator_stored() -> None:
    endpoint = session.Endpoint("127.0.0.1", closed_port(), connect_timeout=1.0)
    call = session._TrainCall(endpoint, train_request())
    call.error = TApplicationException(TApplicationException.INTERNAL_ERROR, "Internal error")
    with pytest.raises(session.ClientError) as info:
        session._train_outcome(call, endpoint, "run-1")
    assert "--resume" not in str(info.value)
    assert "no run to resume" in str(info.value)
    call.seen = True  # the coordinator reported the run while it ran
    with pytest.raises(session.ClientError, match="--resume run-1"):
        session._train_outcome(call, endpoint, "run-1")
