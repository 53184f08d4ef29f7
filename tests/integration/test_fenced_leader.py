"""A leader fenced once, on a shared PostgreSQL run store: woken after the standby took over,
it answers as the standby it now is, and it leads again, like any standby, once the new
leader dies. Real coordinator, node and client processes, and a real PostgreSQL server."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import psycopg

from tests.integration.test_failover import (
    ROUNDS,
    TRAIN,
    Pair,
    _finish,
    _same_weights,
    uninterrupted,
)
from thrift_trainer.wire.generated import Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

__all__ = ["uninterrupted"]  # the module's fixture, shared with test_failover


def _pause_until_taken_over(pair: Pair) -> None:
    """A (running run same, slow) paused until B has taken the run over."""
    pair.a.wait_for(r"round 2/6", timeout=60)
    pair.a.popen.send_signal(signal.SIGSTOP)
    pair.b.wait_for("run same taken over", timeout=30)


def _stepped_down(pair: Pair) -> str:
    return (r"stepped down: the lease of epoch 1 is lost, "
            rf"127.0.0.1:{pair.b.port} leads now \(epoch 2\)")


def _status(port: int, run_id: str) -> ttypes.RunStatus:
    with connect(Coordinator.Client, "127.0.0.1", port, connect_timeout=5.0,
                 read_timeout=10.0) as client:
        return client.status(ttypes.StatusRequest(run_id=run_id))


def _stored_round(url: str, run_id: str) -> int:
    with psycopg.connect(url) as db:
        return db.execute("SELECT max(round) FROM rounds WHERE run_id = %s",
                          (run_id,)).fetchone()[0]


def test_a_woken_ex_leader_answers_with_the_new_leader_and_the_store_s_state(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray]) -> None:
    pair = Pair(tmp_path, postgres_url, slow=True)
    try:
        client = pair.start_client("same")
        _pause_until_taken_over(pair)
        pair.b.wait_for(r"round 4/6", timeout=60)  # past the round the paused A was at
        recorded = _stored_round(postgres_url, "same")
        pair.a.popen.send_signal(signal.SIGCONT)  # it wakes believing it leads
        answers: list[ttypes.RunStatus] = []
        deadline, after_step_down = time.monotonic() + 30, 0
        while time.monotonic() < deadline and after_step_down < 5:
            answers.append(_status(pair.a.port, "same"))
            if "stepped down" in pair.a.log():
                after_step_down += 1
        pair.a.wait_for(_stepped_down(pair), timeout=30)
        leader = f"127.0.0.1:{pair.b.port}"
        for n, status in enumerate(answers):
            assert (status.leader, status.state in ("running", "completed"),
                    status.round >= recorded) == (leader, True, True), (
                f"answer {n} of {len(answers)} after waking: leader {status.leader!r}, "
                f"{status.state} at round {status.round} (the store had {recorded}): "
                f"{status.message}")
        result, _ = _finish(pair, client)
        assert result["rounds"] == ROUNDS and _same_weights(pair, "same", uninterrupted)
    finally:
        pair.stop()


def test_a_fenced_leader_leads_again_once_the_new_leader_dies(
        tmp_path: Path, postgres_url: str, uninterrupted: dict[str, np.ndarray]) -> None:
    pair = Pair(tmp_path, postgres_url, slow=True)
    try:
        first = pair.start_client("same")
        _pause_until_taken_over(pair)
        pair.a.popen.send_signal(signal.SIGCONT)
        pair.a.wait_for(_stepped_down(pair), timeout=30)
        result, _ = _finish(pair, first)
        assert result["rounds"] == ROUNDS and _same_weights(pair, "same", uninterrupted)
        # a run of 5 rounds (its lines unlike the first run's) on B, which dies mid-run
        again = pair.start_client("again", ["letters", "5", *TRAIN[2:]])
        pair.b.wait_for(r"round 2/5", timeout=60)
        pair.b.popen.kill()
        pair.a.wait_for(r"leading the run store .* \(epoch 3\)", timeout=30)
        pair.a.wait_for("run again taken over from the previous leader", timeout=30)
        result, _ = _finish(pair, again)
        assert result["rounds"] == 5
        assert result["coordinator_run_dir"].startswith(str(pair.workdir / "runs-a"))
        # the run it held before it was fenced ended on B: A tells the store's state of it
        earlier = _status(pair.a.port, "same")
        assert (earlier.state, earlier.round, earlier.leader) == (
            "completed", ROUNDS, f"127.0.0.1:{pair.a.port}"), earlier
        new = pair.start_client("new", ["letters", "1", *TRAIN[2:]])  # A takes new runs
        result, _ = _finish(pair, new)
        assert result["coordinator_run_dir"].startswith(str(pair.workdir / "runs-a"))
    finally:
        pair.stop()
