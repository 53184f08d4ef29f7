"""In-process compute nodes: the coordinator's round engine without sockets.

`InProcessNodeClient` is the NodeClient (engine.nodes.client) of a ComputeNodeHandler
in this process: no connection, no serialisation, so engine and algorithm tests run in
milliseconds. Its failures are mapped like the Thrift client's. A LocalNode is the
NodeHandle over one; `fail_with` makes every training call fail with that error, as a
dead or broken node would.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.engine.nodes.client import AttemptKey, NodePing, RunAnswer, RunQuery
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.thrift_client import (
    SessionRequests,
    mapped_errors,
    run_answer,
    run_check_request,
    task_result,
    work_request,
)
from thrift_trainer.engine.tasks import Task, TaskResult
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.stats import PayloadBytes


class InProcessNodeClient(SessionRequests):
    accepts_connections = True

    def __init__(self, handler: ComputeNodeHandler, address: NodeAddress,
                 fail_with: Exception | None = None) -> None:
        self.handler = handler
        self.address: NodeAddress | None = address
        self.fail_with = fail_with
        self.payload = PayloadBytes()  # nothing crosses a wire: stays at zero

    def train(self, task: Task) -> TaskResult:
        with mapped_errors():
            if self.fail_with is not None:
                raise self.fail_with
            return task_result(self.handler.train_with_weights(work_request(task)), task)

    def abort(self, key: AttemptKey, reason: str) -> bool:
        return False  # the call runs on the caller's thread: nothing to interrupt

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        with mapped_errors():
            self.handler.cancel_unit(ttypes.CancelUnitRequest(run_id=run_id, unit_id=unit_id,
                                                              attempt=attempt))

    def ping(self, warm_up: str | None = None) -> NodePing:
        with mapped_errors():
            info = self.handler.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION,
                                                        warm_up=warm_up))
        return NodePing(list(info.delaying or []), dict(info.progress or {}),
                        bool(info.warming_up), info.role)

    def check_run(self, query: RunQuery) -> RunAnswer:
        with mapped_errors():
            return run_answer(self.handler.check_run(run_check_request(query)))

    def _session_call(self, method: str, request: Any, quick: bool = False) -> Any:
        with mapped_errors():
            return getattr(self.handler, method)(request)

    def forget_connections(self) -> None:
        """No connections."""

    def close(self) -> None:
        """No connections."""


class LocalNode(NodeHandle):
    def __init__(self, index: int, load: float = 0.0, delay: float = 0.0, seed: int = 0,
                 data_root: Path = DEFAULT_DATA_ROOT, fail_with: Exception | None = None
                 ) -> None:
        address = NodeAddress("local", 10000 + index)
        self.handler = ComputeNodeHandler(str(address), data_root,
                                          LoadSimulator(load, delay, seed=seed))
        super().__init__(index, str(address),
                         InProcessNodeClient(self.handler, address, fail_with))
        self.calls = 0
        self._calls_lock = threading.Lock()

    def train(self, task: Task) -> TaskResult:
        with self._calls_lock:
            self.calls += 1
        return super().train(task)
