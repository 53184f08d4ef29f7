"""`client.py sweep` and `client.py compare` through real processes: a grid over seeds
trains one run after another on the cluster and ends with the comparison."""

from __future__ import annotations

import json

from devtools import local_cluster as procs


def sweep(cluster, *args: str):
    return procs.run_client(["sweep", "127.0.0.1", str(cluster.coordinator.port), *args],
                            cluster.workdir, timeout=300)


def test_a_sweep_trains_its_grid_over_seeds_and_compares_the_settings(cluster):
    cluster.add_node()
    cluster.add_node()
    cluster.start_coordinator(2)
    done = sweep(cluster, "--set", "run.rounds=2", "--set", "delta_avg.epochs=2",
                 "--grid", "delta_avg.eta=0.001,0.01", "--seeds", "1,2", "--name", "eta",
                 "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr + cluster.logs()
    folder = cluster.workdir / "sweeps" / "eta"
    compared = json.loads((folder / "compare.json").read_text())
    settings = {row["setting"]: row for row in compared["settings"]}
    assert set(settings) == {"eta=0.001", "eta=0.01"}, settings
    for row in settings.values():
        assert row["seeds"] == [1, 2] and len(row["runs"]) == 2
    for run_id in ("eta-01-s1", "eta-01-s2", "eta-02-s1", "eta-02-s2"):
        record = json.loads((folder / f"{run_id}.json").read_text())
        assert record["run"]["settings"]["seed"] == int(run_id[-1])
        assert len(record["result"]["history"]) == 2
        assert (folder / f"{run_id}.npz").is_file()
    assert (folder / "compare.png").stat().st_size > 10_000
    assert "eta=0.01" in done.stdout and "picture:" in done.stdout
    # the two seeds of a setting trained differently (else the spread would mean nothing)
    finals = [json.loads((folder / f"eta-02-s{s}.json").read_text())["result"]
              ["validation_error"] for s in (1, 2)]
    assert finals[0] != finals[1]

    # the coordinator's run folders compare the same, bytes included
    runs = cluster.workdir / "runs"
    again = procs.run_client(["compare", str(runs / "eta-01-s1"), str(runs / "eta-02-s1"),
                              "--out", "two.png", "--json"], cluster.workdir)
    assert again.returncode == 0, again.stderr
    rows = json.loads(again.stdout)["settings"]
    assert {row["setting"] for row in rows} == {"eta=0.001", "eta=0.01"}
    assert all(row["mib"] > 0 for row in rows)
    assert (cluster.workdir / "two.png").is_file()


def test_a_sweep_with_a_bad_key_starts_nothing(cluster):
    cluster.add_node()
    cluster.start_coordinator(2)
    done = sweep(cluster, "--grid", "delta_avg.etta=0.1,0.2", "--quiet")
    assert done.returncode == 2
    assert "the sweep was not started" in done.stderr and "etta" in done.stderr
    runs = procs.run_client(["runs", "127.0.0.1", str(cluster.coordinator.port), "--json"],
                            cluster.workdir)
    assert runs.returncode == 0 and json.loads(runs.stdout) == [], runs.stdout + runs.stderr
