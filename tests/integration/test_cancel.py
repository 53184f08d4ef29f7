"""Cancel through real processes: a cancelled run stops its maths on the nodes, and
cancels to a frozen node never stall the rounds."""

from __future__ import annotations

import json
import os
import signal
import time

from devtools import local_cluster as procs

HUGE = ["letters", "1", "1000000", "20", "0.0001"]  # days of epochs on one node
# A coordinator's --max-epochs refuses such a request by default; one that allows it must
# still be able to stop the work.
ALLOW_HUGE = ("--max-epochs", "1000000")
SMALL = ["letters", "1", "2", "20", "0.0001"]
SERVED_WITHIN = 45.0  # generous on a loaded machine; a node left computing takes hours


def test_a_cancelled_run_frees_its_node_for_the_next_run(cluster):
    node = cluster.add_node(0.0)
    cluster.start_coordinator(2, "--no-speculation", *ALLOW_HUGE)
    client = cluster.start_client(*HUGE, "--run-id", "huge", "--quiet")
    try:
        node.wait_for(r"unit \S+ round 1 accepted", timeout=60)
        cancel = procs.run_client(["cancel", "127.0.0.1", str(cluster.coordinator.port),
                                   "huge"], cluster.workdir, timeout=30)
        assert cancel.returncode == 0, cancel.stderr
        _, err = client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 3, err  # cancelled on the coordinator, by another client
    assert "cancelled" in err
    attached = procs.run_client(["attach", "127.0.0.1", str(cluster.coordinator.port)],
                                cluster.workdir, timeout=30)
    assert attached.returncode == 3, attached.stderr  # the latest run, which was cancelled
    assert "Run huge: cancelled" in attached.stdout
    assert "out 0" in attached.stdout  # its attempts ended with it, none below zero
    began = time.monotonic()
    result = cluster.train_json(*SMALL, "--run-id", "next", timeout=SERVED_WITHIN)
    assert time.monotonic() - began < SERVED_WITHIN
    assert result["run_id"] == "next" and len(result["history"]) == 1


ROUNDS = 12
CONTROL_TIMEOUT = 5.0  # what a cancel to a frozen node waits (node_pool)


def test_a_frozen_node_does_not_stall_rounds_with_cancels(cluster):
    """Each round's quorum leaves a unit on the frozen node, whose cancel would cost the
    round the control timeout if it were sent on the round's path."""
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    frozen = cluster.add_node(0.0)
    # Suspect quickly, dead never within the test: the frozen node keeps getting units,
    # and backups on the others finish them.
    cluster.start_coordinator(2, "--heartbeat", "0.2",
                              "--suspect-after", "0.6", "--dead-after", "300")
    client = cluster.start_client(
        "--config", str(procs.REPO / "configs" / "letters_sync_sgd.yaml"),
        "--set", f"run.rounds={ROUNDS}", "--set", "sync_sgd.hidden=[16]",
        "--run-id", "frozen", "--json", "--quiet")
    try:
        frozen.wait_for(r"round 1 accepted", timeout=60)
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        out, err = client.communicate(timeout=180)
    finally:
        os.kill(frozen.popen.pid, signal.SIGCONT)
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    rounds = json.loads(out)["history"]
    assert len(rounds) == ROUNDS
    # After the round it froze in, serial cancels would cost every round 5 s or more
    # (about 0.4 s without them); allow half of that in all.
    seconds = [r["seconds"] for r in rounds[1:]]
    assert sum(seconds) < len(seconds) * CONTROL_TIMEOUT / 2, (seconds, cluster.logs())
