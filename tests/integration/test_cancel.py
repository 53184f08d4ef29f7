"""Cancel through real processes: a cancelled run stops its maths on the nodes."""

from __future__ import annotations

import time

from devtools import local_cluster as procs

HUGE = ["letters", "1", "1000000", "20", "0.0001"]  # days of epochs on one node
SMALL = ["letters", "1", "2", "20", "0.0001"]
SERVED_WITHIN = 45.0  # generous on a loaded machine; a node left computing takes hours


def test_a_cancelled_run_frees_its_node_for_the_next_run(cluster):
    node = cluster.add_node(0.0)
    cluster.start_coordinator(2, "--no-speculation")
    client = cluster.start_client(*HUGE, "--run-id", "huge", "--quiet")
    try:
        node.wait_for(r"unit \S+ round 1 accepted", timeout=60)
        cancel = procs.run_client(["cancel", "127.0.0.1", str(cluster.coordinator.port),
                                   "huge"], cluster.workdir, timeout=30)
        assert cancel.returncode == 0, cancel.stderr
        client.communicate(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    node.wait_for(r"cancelled after \d+ batches", timeout=SERVED_WITHIN)
    began = time.monotonic()
    result = cluster.train_json(*SMALL, "--run-id", "next", timeout=SERVED_WITHIN)
    assert time.monotonic() - began < SERVED_WITHIN
    assert result["run_id"] == "next" and len(result["history"]) == 1
