"""A node that has the token, acting for another node: what it may not do.

The attacker calls from 127.0.0.2 (tests/hostile.py) with the shared token, as a pull node
of the cluster could. It reads which unit the honest pull node holds from the run's status,
then tries to settle that lease with a result of its own, to register under the honest
node's id (which would close its mailbox), to heartbeat and to leave for it. Each is
refused, and the honest node's own result is taken.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from devtools import local_cluster as procs
from tests.conftest import Cluster
from tests.hostile import AttackerClient
from tests.waiting import wait_until
from thrift_trainer.wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

TOKEN = "members-token"
HOST = "127.0.0.1"
V = PROTOCOL_VERSION


def held_unit(port: int, run_id: str, node: str) -> ttypes.UnitInfo | None:
    """The unit of `run_id` that `node` holds now, from the run's status."""
    with connect(Coordinator.Client, HOST, port, token=TOKEN, read_timeout=10.0) as client:
        try:
            status = client.status(ttypes.StatusRequest(run_id=run_id))
        except ttypes.UnknownRun:
            return None
    return next((u for u in status.unfinished or []
                 if u.node == node and u.status == "in_progress"), None)


def forged_result() -> ttypes.TrainResult:
    return ttypes.TrainResult(accepted=False, outcome=ttypes.UnitOutcome.CANCELLED, update=[],
                              num_samples=0, loss=0.0, error=0.0, compute_seconds=0.0,
                              delay_seconds=0.0, message="settled by someone else")


def test_a_pull_nodes_lease_and_registration_are_its_own(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    coordinator = cluster.start_coordinator(1, "--token-file", str(token_file), nodes=[])
    # every unit waits 20 s in the node's load delay, leased all that time
    honest = procs.start_pull_node(tmp_path, "honest", coordinator.port, 1.0,
                                   "--load-delay", "20", "--token-file", str(token_file))
    cluster.nodes.append(honest)  # stopped with the cluster
    coordinator.wait_for(r"node pull:honest registered")
    client = cluster.start_client("letters", "1", "1", "8", "0.01", "--run-id", "bound",
                                  "--token-file", str(token_file), "--quiet")
    try:
        assert wait_until(lambda: held_unit(coordinator.port, "bound", "pull:honest")
                          is not None, 60.0), cluster.logs()
        unit = held_unit(coordinator.port, "bound", "pull:honest")
        with AttackerClient(Coordinator, coordinator.port) as evil:
            settled = evil.submit_result(ttypes.SubmitRequest(
                protocol_version=V, node="pull:honest", run_id="bound", unit_id=unit.unit_id,
                attempt=unit.attempts, result=forged_result(), token=TOKEN))
            assert not settled.accepted
            assert not evil.heartbeat(ttypes.HeartbeatRequest(
                protocol_version=V, node="pull:honest", units_running=0, token=TOKEN)).known
            with pytest.raises(ttypes.InvalidRequest, match="still alive"):
                evil.register_node(ttypes.RegisterRequest(
                    protocol_version=V, node_id="honest", pull=True, token=TOKEN))
            assert not evil.leave(ttypes.LeaveRequest(
                protocol_version=V, node="pull:honest", token=TOKEN)).known
        honest.wait_for(rf"unit {unit.unit_id} round 1 done", timeout=60.0)
        assert "not taken" not in honest.log()
    finally:
        client.send_signal(signal.SIGINT)  # cancels the run
        client.communicate(timeout=60)
    assert "registered again" not in coordinator.log()
    assert "node pull:honest left" not in coordinator.log()
