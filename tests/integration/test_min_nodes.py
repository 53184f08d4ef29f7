"""A minimum of nodes through real processes: pausing below it, resuming, waiting to start."""

from __future__ import annotations

import json

from devtools import local_cluster as procs
from tests.waiting import wait_until
from thrift_trainer.wire.generated import Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

LONG_RUN = ["letters", "30", "15", "20", "0.0001", "--compat"]
# Every unit waits 0.2s on its node (policy 1, load 1.0), so 30 rounds take well over the
# seconds a killed node needs to be found dead, however fast the machine.
DELAYED = ("--load-delay", "0.2")
FAST_LIVENESS = ["--heartbeat", "0.2", "--suspect-after", "0.6", "--dead-after", "1.5"]


def _status(cluster, run_id: str) -> ttypes.RunStatus | None:
    try:
        with connect(Coordinator.Client, "127.0.0.1", cluster.coordinator.port,
                     connect_timeout=2.0, read_timeout=5.0) as client:
            return client.status(ttypes.StatusRequest(run_id=run_id))
    except ttypes.UnknownRun:
        return None  # train() has not registered the run yet


def _wait_for_message(cluster, run_id: str, text: str, timeout: float = 60.0
                      ) -> ttypes.RunStatus:
    seen: list[ttypes.RunStatus | None] = [None]

    def shows_text() -> bool:
        seen[0] = _status(cluster, run_id)
        return seen[0] is not None and text in (seen[0].message or "")

    def still_running() -> bool:  # a run that ended will never show it
        return cluster.coordinator.alive() and (seen[0] is None or seen[0].state == "running")

    if not wait_until(shows_text, timeout, alive=still_running, interval=0.2):
        raise AssertionError(f"no status with {text!r} in time; last: {seen[0]}\n"
                             f"{cluster.logs()}")
    return seen[0]


def _finish(client, timeout: float = 240.0) -> tuple[str, str]:
    try:
        return client.communicate(timeout=timeout)
    finally:
        if client.poll() is None:
            client.kill()


def test_a_run_below_min_nodes_pauses_and_continues_when_the_node_comes_back(cluster):
    cluster.add_node(1.0, *DELAYED)
    leaving = cluster.add_node(1.0, *DELAYED)
    cluster.start_coordinator(1, "--no-speculation", "--min-nodes", "2", "--pause-below-min",
                              *FAST_LIVENESS)
    client = cluster.start_client(*LONG_RUN, "--run-id", "paused", "--json", "--quiet")
    try:
        leaving.wait_for(r"round 2 accepted", timeout=60)
        leaving.kill()
        paused = _wait_for_message(cluster, "paused", "waiting for nodes")
        assert paused.state == "running" and paused.round < 30
        back = procs.start("compute_node.py", [str(leaving.port), "1.0", "--host", "127.0.0.1",
                                               *DELAYED], cluster.workdir, "node2-again")
        cluster.nodes.append(back)
        _continues(cluster, "paused", paused.round, back)
    finally:
        _cancel(cluster, "paused", client)


def _continues(cluster, run_id: str, paused_round: int, node: procs.Proc) -> None:
    """The paused run went on: it says so, `node` trains for it, and rounds pass."""
    cluster.coordinator.wait_for(r"run continues", timeout=60)
    node.wait_for(r"accepted", timeout=60)
    def rounds_pass() -> bool:
        status = _status(cluster, run_id)
        return status is not None and status.round > paused_round + 1

    if not wait_until(rounds_pass, 60, alive=cluster.coordinator.alive, interval=0.2):
        raise AssertionError(f"no round after {paused_round + 1} in time\n{cluster.logs()}")


def _cancel(cluster, run_id: str, client) -> None:
    """End the long run here: what follows the pause has been seen."""
    procs.run_client(["cancel", "127.0.0.1", str(cluster.coordinator.port), run_id],
                     cluster.workdir, timeout=30)
    _finish(client, timeout=60)


def test_a_paused_run_takes_in_a_node_that_registers_and_continues(cluster):
    cluster.add_node(1.0, *DELAYED)
    leaving = cluster.add_node(1.0, *DELAYED)
    coordinator = cluster.start_coordinator(1, "--no-speculation", "--min-nodes", "2",
                                            "--pause-below-min", *FAST_LIVENESS)
    client = cluster.start_client(*LONG_RUN, "--run-id", "joined", "--json", "--quiet")
    try:
        leaving.wait_for(r"round 2 accepted", timeout=60)
        leaving.kill()
        paused = _wait_for_message(cluster, "joined", "waiting for nodes")
        joining = cluster.add_node(1.0, *DELAYED, "--register", f"127.0.0.1:{coordinator.port}",
                                   "--advertise", "127.0.0.1")
        _continues(cluster, "joined", paused.round, joining)
    finally:
        _cancel(cluster, "joined", client)


def test_a_pause_longer_than_max_pause_fails_the_run_with_its_reason(cluster):
    cluster.add_node(1.0, *DELAYED)
    leaving = cluster.add_node(1.0, *DELAYED)
    cluster.start_coordinator(1, "--no-speculation", "--min-nodes", "2", "--pause-below-min",
                              "--max-pause", "2", *FAST_LIVENESS)
    client = cluster.start_client(*LONG_RUN, "--run-id", "too-long", "--quiet")
    leaving.wait_for(r"round 2 accepted", timeout=60)
    leaving.kill()
    _, err = _finish(client)
    assert client.returncode == 1, err + cluster.logs()
    assert "fewer than 2 compute nodes answered" in err and "--max-pause 2" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_run_waits_to_start_until_enough_nodes_answer(cluster):
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, "--wait-for-nodes", "2", *FAST_LIVENESS)
    client = cluster.start_client("letters", "3", "5", "20", "0.0001", "--run-id", "waits",
                                  "--json", "--quiet")
    try:
        waiting = _wait_for_message(cluster, "waits", "waiting for nodes: 1 of at least 2")
        assert waiting.round == 0 and waiting.units_done == 0
        shown = procs.run_client(["status", "127.0.0.1", str(coordinator.port), "waits"],
                                 cluster.workdir, timeout=60)
        assert "running" in shown.stdout and "waiting for nodes" in shown.stdout, shown.stderr
        registered = cluster.add_node(0.0, "--register", f"127.0.0.1:{coordinator.port}",
                                      "--advertise", "127.0.0.1")
        out, err = _finish(client)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    by_node = {n["node"]: n for n in json.loads(out)["nodes"]}
    assert by_node[f"127.0.0.1:{registered.port}"]["accepted"] > 0
