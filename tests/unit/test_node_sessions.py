"""A node's session store and session calls, in process: staging, bounds, drop, errors."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.sessions import SessionError, SessionStore
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict


class State:
    def __init__(self, value: float) -> None:
        self.value = value

    def export(self) -> dict[str, np.ndarray]:
        return {"w": np.array([self.value], np.float32)}


def test_staged_imports_wait_for_their_swap_id_and_the_newest_wins() -> None:
    store = SessionStore()
    store.stage("r", "d0", 2, {"w": np.array([2.0])})
    store.stage("r", "d0", 1, {"w": np.array([1.0])})
    store.stage("r", "d0", 3, {"w": np.array([3.0])})
    with store.use("r", "d0") as session:
        assert session.take_staged(0) is None  # a unit of an earlier iteration sees none
        assert session.take_staged(2)["w"][0] == 2.0  # 1 is superseded by 2
        assert sorted(session.staged) == [3]  # a later swap stays staged
        assert session.take_staged(2) is None


def test_export_reads_the_trained_state_never_a_staged_import() -> None:
    store = SessionStore()
    with pytest.raises(SessionError, match="no session 'd0' of run 'r'"):
        store.export("r", "d0")
    store.stage("r", "d0", 1, {"w": np.array([9.0])})
    with pytest.raises(SessionError, match="has not trained yet"):
        store.export("r", "d0")
    with store.use("r", "d0") as session:
        session.state = State(4.0)
    assert store.export("r", "d0")["w"][0] == 4.0


def test_the_store_is_bounded_and_drops_the_least_recently_used_idle_session() -> None:
    store = SessionStore(max_sessions=2)
    for name in ("a", "b"):
        with store.use("r", name) as session:
            session.state = State(1.0)
    with store.use("r", "a"):
        pass  # a is now the most recently used
    with store.use("r", "c") as session:
        session.state = State(2.0)
    assert len(store) == 2
    with pytest.raises(SessionError):
        store.export("r", "b")
    assert store.export("r", "a") and store.export("r", "c")


def test_a_session_in_use_is_never_evicted() -> None:
    store = SessionStore(max_sessions=1)
    with store.use("r", "busy") as busy:
        busy.state = State(1.0)
        with store.use("r", "other") as other:
            other.state = State(2.0)
        assert len(store) == 2  # over the bound while "busy" is held, rather than losing it
    assert store.export("r", "busy")["w"][0] == 1.0


def test_drop_run_forgets_only_that_run() -> None:
    store = SessionStore()
    for run_id, name in (("r1", "d0"), ("r1", "d1"), ("r2", "d0")):
        with store.use(run_id, name) as session:
            session.state = State(0.0)
    assert store.drop_run("r1") == 2
    assert len(store) == 1 and store.export("r2", "d0")


def handler() -> ComputeNodeHandler:
    return ComputeNodeHandler("node", ".", LoadSimulator(0.0, 0.0, seed=0))


def test_the_node_service_exports_imports_and_drops_sessions() -> None:
    node = handler()
    with node.sessions.use("r", "d1") as session:
        session.state = State(5.0)
    state = node.export_session(ttypes.SessionRequest(protocol_version=PROTOCOL_VERSION,
                                                      run_id="r", session="d1"))
    assert state.bytes == 4 and wire_to_dict(state.tensors)["w"][0] == 5.0
    ack = node.import_session(ttypes.ImportSessionRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", session="d2", swap_id=1,
        tensors=dict_to_wire({"w": np.array([6.0], np.float32)})))
    assert ack.ok and ack.bytes == 4
    with node.sessions.use("r", "d2") as session:
        assert session.take_staged(1)["w"][0] == 6.0
    dropped = node.drop_sessions(ttypes.DropSessionsRequest(protocol_version=PROTOCOL_VERSION,
                                                            run_id="r"))
    assert dropped.ok and dropped.message == "dropped 2 sessions"
    with pytest.raises(ttypes.InvalidRequest, match="no session 'd1'"):
        node.export_session(ttypes.SessionRequest(protocol_version=PROTOCOL_VERSION,
                                                  run_id="r", session="d1"))


def test_session_calls_check_the_protocol_version() -> None:
    with pytest.raises(ttypes.VersionMismatch):
        handler().drop_sessions(ttypes.DropSessionsRequest(protocol_version=PROTOCOL_VERSION + 1,
                                                           run_id="r"))
