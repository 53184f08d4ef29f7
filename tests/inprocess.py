"""In-process compute nodes: the coordinator's round engine without sockets.

A LocalNode is a NodeHandle whose calls go straight to a ComputeNodeHandler in
this process, so engine and algorithm tests run in milliseconds; `fail_with`
makes every call raise, as a dead or broken node would.
"""

from __future__ import annotations

import threading
from pathlib import Path

from compute_node.handler import ComputeNodeHandler
from compute_node.load import LoadSimulator
from coordinator.node_pool import NodeHandle
from coordinator.nodes_file import NodeAddress
from training.datapaths import DEFAULT_DATA_ROOT
from wire.generated import ttypes


class LocalNode(NodeHandle):
    def __init__(self, index: int, load: float = 0.0, delay: float = 0.0, seed: int = 0,
                 data_root: Path = DEFAULT_DATA_ROOT, fail_with: Exception | None = None
                 ) -> None:
        super().__init__(index, NodeAddress("local", 10000 + index), rpc_timeout=5.0,
                         connect_timeout=1.0)
        self.handler = ComputeNodeHandler(self.name, data_root,
                                          LoadSimulator(load, delay, seed=seed))
        self.fail_with = fail_with
        self.calls = 0
        self._calls_lock = threading.Lock()

    def train(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
        with self._calls_lock:
            self.calls += 1
        if self.fail_with is not None:
            raise self.fail_with
        return self.handler.train_with_weights(request)

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        self.handler.cancel_unit(ttypes.CancelUnitRequest(run_id=run_id, unit_id=unit_id,
                                                          attempt=attempt))
