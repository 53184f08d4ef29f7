"""The Thrift node client over loopback: every failure reaches the engine as one of the
coordinator's own exceptions (engine.nodes.errors), whatever the transport raised."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from thrift_trainer.engine.nodes.errors import (
    AttemptAborted,
    InvalidResult,
    NodeIncompatible,
    NodeRefused,
    NodeRemoteError,
    NodeTimedOut,
    NodeUnavailable,
)
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.thrift_client import ThriftNodeClient
from thrift_trainer.engine.tasks import Task, TaskStatus
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
from thrift_trainer.wire.rpc import ThriftServer

HOST = "127.0.0.1"
WAIT = 20.0


class ScriptedNode(ComputeNode.Iface):
    """Answers a unit as its run_id says: ok, invalid, version, crash, or wait."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        return ttypes.NodeInfo(PROTOCOL_VERSION, "scripted", 0.0, 0, 0, 0, 1.0,
                               delaying=["r/u/1"], progress={"r/u/1": 3})

    def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        if request.run_id == "invalid":
            raise ttypes.InvalidRequest(message="unit_path is empty")
        if request.run_id == "version":
            raise ttypes.VersionMismatch("protocol 99 expected", 99, request.protocol_version)
        if request.run_id == "crash":
            raise RuntimeError("handler bug")
        update = []
        if request.run_id == "garbled":  # 2 bytes where a float64 of 3 needs 24
            update = [ttypes.Tensor(name="w", dtype="float64", shape=[3], data=b"12")]
        elif request.run_id == "echo":
            update = request.weights
        if request.run_id == "wait":
            self.entered.set()
            self.release.wait(WAIT)
        return ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED,
                                  update=update, num_samples=1, loss=0.0, error=0.0,
                                  compute_seconds=0.0, delay_seconds=0.0)


def work(run_id: str, weights: dict | None = None) -> Task:
    return Task(run_id=run_id, round=7, unit_id="u", attempt=1, algorithm="delta_avg",
                model="mlp", dataset="letters", unit_path="p", config_json="{}",
                weights=weights or {}, scheduling_policy=2)


@pytest.fixture
def node() -> ScriptedNode:
    return ScriptedNode()


@pytest.fixture
def address(node: ScriptedNode) -> Iterator[NodeAddress]:
    server = ThriftServer(ComputeNode.Processor(node), HOST, 0)
    thread = server.serve_in_thread()
    yield NodeAddress(HOST, server.port)
    node.release.set()
    server.stop()
    thread.join(WAIT)


def client(address: NodeAddress, rpc_timeout: float = WAIT) -> ThriftNodeClient:
    return ThriftNodeClient(address, rpc_timeout=rpc_timeout, connect_timeout=5.0)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def test_an_answer_and_a_ping_come_back(address: NodeAddress) -> None:
    node = client(address)
    result = node.train(work("ok"))
    # round 7's weights are model version 6 (Task.version)
    assert (result.status, result.num_samples, result.model_version) == (
        TaskStatus.COMPLETED, 1, 6)
    ping = node.ping()
    assert ping.delaying == ["r/u/1"] and ping.progress == {"r/u/1": 3}
    node.close()


@pytest.mark.parametrize(("run_id", "error", "message"), [
    ("invalid", NodeRefused, "unit_path is empty"),
    ("version", NodeIncompatible, "protocol 99 expected"),
    ("crash", NodeRemoteError, None),
    ("garbled", InvalidResult, r"invalid result: tensor 'w'.* needs 24 bytes"),
])
def test_declared_and_remote_errors_are_mapped(address: NodeAddress, run_id: str,
                                               error: type, message: str | None) -> None:
    node = client(address)
    with pytest.raises(error, match=message):
        node.train(work(run_id))
    node.close()


def test_tensors_cross_as_arrays_both_ways(address: NodeAddress) -> None:
    node = client(address)
    sent = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(2.5)}
    got = node.train(work("echo", sent)).update
    assert list(got) == ["w", "b"]
    assert all(np.array_equal(got[k], sent[k]) and got[k].dtype == sent[k].dtype for k in sent)
    node.close()


def test_a_closed_port_is_unavailable_for_every_call() -> None:
    node = client(NodeAddress(HOST, closed_port()))
    for call in (lambda: node.train(work("ok")), node.ping,
                 lambda: node.cancel("r", "u"), lambda: node.drop_sessions("r")):
        with pytest.raises(NodeUnavailable, match="cannot connect"):
            call()


def test_a_node_slower_than_the_read_timeout_timed_out(address: NodeAddress) -> None:
    with pytest.raises(NodeTimedOut):
        client(address, rpc_timeout=0.3).train(work("wait"))


def test_an_aborted_call_raises_the_abort_reason(address: NodeAddress,
                                                 node: ScriptedNode) -> None:
    thrift_node = client(address)
    failure: list[BaseException] = []

    def call() -> None:
        try:
            thrift_node.train(work("wait"))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failure.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert node.entered.wait(WAIT)
    assert thrift_node.abort(("wait", "u", 1), "deadline exceeded")
    caller.join(WAIT)
    assert len(failure) == 1 and isinstance(failure[0], AttemptAborted)
    assert str(failure[0]) == "deadline exceeded"
