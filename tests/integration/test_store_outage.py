"""A PostgreSQL run store away for longer than --store-outage: the runs it cut off fail,
and once the database answers again the same coordinator process trains new runs. Real
coordinator, node and client processes, and a real PostgreSQL server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import local_cluster as procs
from tests.integration.test_failover import TRAIN
from thrift_trainer.coordinator.postgres_store import ConnectionLost, PostgresRunStore

OUTAGE = "2"  # seconds: --store-outage, short so that the test is
AGAIN = ["letters", "2", "2", "16", "0.01"]  # the run after the outage: two rounds


def test_a_coordinator_trains_again_once_the_database_is_back_after_a_long_outage(
        tmp_path: Path, postgres_server, postgres_url: str) -> None:
    # every unit waits 0.2 s first (policy 1, load 1): the database stops mid-run
    nodes = [procs.start_node(tmp_path, f"node{i}", 1.0, "--seed", str(i), "--load-delay",
                              "0.2") for i in (1, 2)]
    coordinator = procs.start_coordinator(
        tmp_path, procs.write_nodes_file(tmp_path / "compute_nodes.txt", nodes), 1,
        "--store", postgres_url, "--store-outage", OUTAGE)
    try:
        client = subprocess.Popen(
            [sys.executable, str(procs.REPO / "client.py"), "127.0.0.1", str(coordinator.port),
             *TRAIN, "--run-id", "cut", "--json", "--poll", "0.2"], cwd=tmp_path,
            env=procs.python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        coordinator.wait_for(r"round 2/6", timeout=60)
        postgres_server.stop()
        try:
            coordinator.wait_for(rf"for {OUTAGE} s \(--store-outage\)", timeout=60)
            _, err = client.communicate(timeout=60)
            assert client.returncode != 0, err + coordinator.log()
        finally:
            postgres_server.start()
        again = procs.run_client(["127.0.0.1", str(coordinator.port), *AGAIN, "--run-id",
                                  "again", "--json"], tmp_path)
        assert again.returncode == 0, again.stderr + coordinator.log()
        assert json.loads(again.stdout)["rounds"] == 2
    finally:
        if client.poll() is None:
            client.kill()
        for proc in [coordinator, *nodes]:
            proc.stop()


def test_writes_lost_to_a_long_outage_fail_their_run_and_no_later_one(
        postgres_server, postgres_url: str) -> None:
    with PostgresRunStore(postgres_url, outage_seconds=1.0) as opened:
        opened.create_run("cut", algorithm="a", model="m", dataset="d", rounds=1)
        opened.plan_units("cut", 1, ["a"])
        postgres_server.stop()
        try:
            opened.unit_started("cut", 1, "a", 1, "n1:1")  # deferred: the writer makes it
            with pytest.raises(ConnectionLost, match=r"for 1 s \(--store-outage\)"):
                opened.attempts_so_far("cut", 1)
        finally:
            postgres_server.start()
        opened.create_run("next", algorithm="a", model="m", dataset="d", rounds=1)
        opened.plan_units("next", 1, ["a"])
        opened.unit_started("next", 1, "a", 1, "n1:1")
        assert opened.attempts_so_far("next", 1) == {"a": 1}
        with pytest.raises(ConnectionLost):  # the run cut off stays failed
            opened.unit_started("cut", 1, "a", 2, "n1:1")
