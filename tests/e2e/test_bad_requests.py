"""Bad and greedy requests through the real commands: each is refused with one line naming
its field, the coordinator stays up and serves the next run; bogus sample counts from a
node are refused and the run completes."""

from __future__ import annotations

import sqlite3

import pytest

BASE = ["letters", "2", "2", "8", "0.0001"]  # data_dir rounds epochs h eta: a quick run
# (client arguments, exit code, words the one line of stderr must hold)
REFUSED = [
    (["letters", "5000000000", "2", "8", "0.0001"], 2, ["rounds", "32-bit"]),
    (["letters", "5000000", "2", "8", "0.0001"], 2,
     ["rounds: 5000000 is out of range 1..1000000", "--max-rounds"]),
    (["letters", "2", "1000000", "8", "0.0001"], 2,
     ["'epochs': 1000000 is out of range 1..50", "--max-epochs"]),
    ([*BASE, "--hidden", "100000"], 2, ["'hidden': 100000 is out of range", "--max-hidden"]),
    ([*BASE, "--hidden", "8000,8000"], 2, ["'hidden'", "MiB", "--max-model-mb"]),
    ([*BASE, "--server-optimizer", "momentum", "--server-momentum", "2"], 2,
     ["argument --server-momentum"]),
    ([*BASE, "--seed", "-1"], 2, ["argument --seed"]),
    (["x" * 300, "2", "2", "8", "0.0001"], 2, ["dataset: a name of 300 characters"]),
    ([*BASE, "--model", "m" * 100], 2, ["argument --model: invalid choice"]),
]


def test_bad_requests_get_one_line_naming_the_field_and_the_coordinator_serves_on(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2, "--max-epochs", "50")
    for args, code, words in REFUSED:
        done = cluster.client(*args, "--quiet", "--run-id", "refused")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code, (args, done.stderr)
        assert "usage:" in done.stderr or len(lines) == 1, (args, done.stderr)
        assert all(word in lines[-1] for word in words), (args, done.stderr)
        assert "--resume" not in done.stderr, (args, done.stderr)
        assert cluster.coordinator.alive(), cluster.logs()
    assert "Traceback" not in cluster.coordinator.log()
    assert "Internal error" not in cluster.coordinator.log()
    result = cluster.train_json(*BASE, "--run-id", "after")
    assert result["rounds"] == 2


@pytest.mark.parametrize("mode", ["zero-samples", "huge-samples"])
def test_a_node_claiming_bogus_sample_counts_is_refused_and_the_run_completes(cluster, mode):
    cluster.add_node(0.0)
    bogus = cluster.add_node(0.0, "--corrupt-updates", mode)
    cluster.start_coordinator(2)
    result = cluster.train_json("letters", "3", "15", "20", "0.0001", "--compat",
                                "--run-id", "bogus")
    # The assignment's numbers: nothing of the bogus node weighed in.
    assert [round(r["validation_error"], 4) for r in result["history"]] == \
        [0.9574, 0.9277, 0.7954]
    with sqlite3.connect(cluster.workdir / "runs" / "runs.db") as db:
        refused = db.execute("SELECT node FROM unit_events WHERE run_id = 'bogus' AND "
                             "reason LIKE 'invalid result: num_samples % is out of range 1..%'"
                             ).fetchall()
    assert refused and {node for (node,) in refused} == {f"127.0.0.1:{bogus.port}"}
    by_node = {n["node"]: n for n in result["nodes"]}
    assert by_node[f"127.0.0.1:{bogus.port}"]["accepted"] == 0
