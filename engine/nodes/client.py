"""The seam below the round engine: what the coordinator asks of one compute node.

`NodeClient` is everything the engine, the node pool and session moves need from a node:
run a unit, abort or cancel it, ping, and move sessions. Three implementations:
pushed nodes over Thrift (engine.nodes.thrift_client), pull nodes through their mailbox
(engine.nodes.pull_client) and in-process nodes for tests (tests/inprocess.py). Every
failure is one of engine.nodes.errors; bookkeeping (statistics, benching, liveness)
stays in engine.nodes.pool.NodeHandle, above the seam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.records import NodeSummary
from thrift_trainer.engine.tasks import Task, TaskResult
from thrift_trainer.training.run_check import RunFacts
from thrift_trainer.wire.stats import PayloadBytes

AttemptKey = tuple[str, str, int]  # run_id, unit_id, attempt


@dataclass(frozen=True)
class NodePing:
    """A node's answer to a ping: the attempts in their load delay, and batches done."""

    delaying: list[str] = field(default_factory=list)  # "run/unit/attempt"
    progress: dict[str, int] = field(default_factory=dict)
    warming_up: bool = False  # loading libraries or building a model (see warm_up)
    role: str | None = None  # e.g. "relay of 3 nodes", "2 local workers" (NodeInfo.role)
    members: list[NodeSummary] = field(default_factory=list)  # a relay's group (NodeInfo)


@dataclass(frozen=True)
class RunQuery:
    """A run as a node is asked whether it can serve it (its units' fields)."""

    run_id: str
    algorithm: str
    model: str
    dataset: str
    config_json: str


@dataclass(frozen=True)
class RunAnswer:
    """A node's answer to a RunQuery: what it made of the run, or why it cannot serve it."""

    facts: RunFacts | None = None
    problem: str | None = None


class NodeClient(Protocol):
    """One compute node as the coordinator calls it; every method raises only NodeError."""

    accepts_connections: bool  # False for a node others cannot dial (pull mode)
    address: NodeAddress | None  # where other nodes reach it, when they can
    payload: PayloadBytes  # bytes of its training calls (a run shares one counter)

    def train(self, task: Task) -> TaskResult:
        """Run one unit and return its result; an abort makes it raise AttemptAborted."""

    def abort(self, key: AttemptKey, reason: str) -> bool:
        """Give up an attempt in progress; False when it is not in progress here."""

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        """Tell the node to stop a unit (every attempt when ``attempt`` is None)."""

    def ping(self, warm_up: str | None = None) -> NodePing:
        """Liveness; `warm_up` names a model the node should get ready for in the
        background (NodePing.warming_up says when it still is)."""

    def check_run(self, query: RunQuery) -> RunAnswer | None:
        """What the node makes of the run (None: this node cannot be asked, e.g. a pull
        node, which checks itself with its first unit)."""

    def send_session(self, run_id: str, session: str, target: NodeAddress,
                     target_session: str, swap_id: int) -> int:
        """The node sends a session straight to another node; returns the bytes moved."""

    def export_session(self, run_id: str, session: str) -> Any:
        """A session's state, opaque: only `import_session` of another client reads it."""

    def import_session(self, run_id: str, session: str, swap_id: int, state: Any) -> int:
        """Stage an exported state under ``swap_id``; returns the bytes taken in."""

    def drop_sessions(self, run_id: str) -> None:
        """Forget the run's sessions (short timeout)."""

    def forget_connections(self) -> None:
        """The node may have restarted: drop idle connections to it."""

    def close(self) -> None: ...
