"""The samples (rows) each node computed, as the client's summary and `status` show them
for a real run."""

from __future__ import annotations

import json

from devtools.local_cluster import run_client

ROWS_PER_ROUND = 11 * 1500  # a letters round: 11 units of 1,500 rows


def test_the_summary_and_status_count_the_rows_each_node_trained_on(cluster):
    cluster.add_node(0.0)
    cluster.add_node(0.0)
    cluster.start_coordinator(2, "--no-speculation")  # no backups: each unit runs once
    result = cluster.train_json("letters", "2", "1", "20", "0.0001", "--run-id", "counted")
    samples = {n["node"]: n["samples"] for n in result["nodes"]}
    assert sum(samples.values()) == 2 * ROWS_PER_ROUND
    status = run_client(["status", "127.0.0.1", str(cluster.coordinator.port), "counted",
                         "--json"], cluster.workdir)
    assert {n["node"]: n["samples"] for n in json.loads(status.stdout)["nodes"]} == samples
    table = run_client(["status", "127.0.0.1", str(cluster.coordinator.port), "counted"],
                       cluster.workdir)
    assert "samples" in table.stdout
    assert all(str(n) in table.stdout for n in samples.values()), table.stdout
