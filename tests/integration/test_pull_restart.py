"""A run whose only node is a pull node (a laptop behind NAT) that is killed mid-round and
started again with the same arguments: its new registration takes the round's units, and
the run ends with every round and a clean ledger, without --pause-below-min."""

from __future__ import annotations

import json
import re

from devtools import local_cluster as procs
from devtools.ledger_audit import RunShape, audit

ROUNDS = 3
UNITS = 11  # the letters data set's training files: one unit each per round
# 20 local epochs: units of about 0.4 s, so that the node dies with most of round 2 to do
TRAIN = ["--config", str(procs.REPO / "configs" / "letters_recommended.yaml"),
         "--set", f"run.rounds={ROUNDS}", "--set", "delta_avg.epochs=20"]
GRACE = "20"  # without the fix the run fails this long after the node died


def pull_args(port: int) -> list[str]:
    return ["--pull", f"127.0.0.1:{port}", "0.0", "--node-id", "laptop"]


# In sync rounds; the async and buffered modes are replayed by the simulator's kept plans
# (tests/simulation_plans/lone-pull-node-restarts-mid-round-*.json), in virtual time.
def test_a_lone_pull_node_killed_mid_round_and_started_again_carries_the_run_on(
        cluster) -> None:
    mode = "sync"
    coordinator = cluster.start_coordinator(2, "--grace", GRACE, nodes=[])
    node = procs.start("compute_node.py", pull_args(coordinator.port), cluster.workdir,
                       "laptop", ready=procs.PULLING)
    cluster.nodes.append(node)  # stopped with the cluster
    coordinator.wait_for(r"node pull:laptop registered")
    run_id = f"restarted-{mode}"
    client = cluster.start_client(*TRAIN, "--set", f"schedule.mode={mode}", "--run-id",
                                  run_id, "--json", "--quiet")
    try:
        node.wait_for(r"unit \S+ round 2 accepted", timeout=60)  # its first of round 2
        node.kill()  # SIGKILL: no goodbye, its lease is left open
        again = procs.start("compute_node.py", pull_args(coordinator.port), cluster.workdir,
                            "laptop-again", ready=procs.PULLING)
        cluster.nodes.append(again)
        out, err = client.communicate(timeout=240)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
    assert client.returncode == 0, err + cluster.logs()
    result = json.loads(out)
    assert result["rounds"] == ROUNDS
    coordinator.wait_for(r"nodes registered again: pull:laptop")
    # the restarted node took units of the round it died in, not only of the next one
    assert re.search(r"unit \S+ round 2 done", again.log()), again.log()
    shape = RunShape(ROUNDS, UNITS, mode)
    ledger = audit(cluster.workdir / "runs" / "runs.db", run_id, shape)
    assert ledger.ok, [c for c in ledger.checks if not c.ok]
