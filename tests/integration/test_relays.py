"""Relay nodes: a node that computes its units on a group of nodes, in real processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from devtools import local_cluster as procs
from devtools.local_cluster import REPO
from tests.tls_certs import make_certs
from tests.waiting import wait_until
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.thrift_client import ThriftNodeClient
from thrift_trainer.training.outputs.model_file import load_model

ASSIGNMENT = ["letters", "5", "15", "20", "0.0001", "--compat"]
# sync SGD with K = N: every unit's gradient is used, so a relay's slices must add up to it
SYNC_SGD = ["--config", str(REPO / "configs" / "letters_sync_sgd.yaml"), "--set",
            "run.rounds=2", "--set", "sync_sgd.num_workunits_per_update=4",
            "--set", "sync_sgd.units_per_iteration=4"]


def relay_over(cluster, name: str, members: list[procs.Proc], *extra: str) -> procs.Proc:
    """A relay (started like a node, kept with the cluster's nodes) over ``members``."""
    group = procs.write_nodes_file(cluster.workdir / f"{name}.txt", members)
    relay = procs.start_node(cluster.workdir, name, 0.0, "--relay", str(group), *extra)
    cluster.nodes.append(relay)
    return relay


def two_relays_of_two(cluster) -> list[procs.Proc]:
    members = [cluster.add_node(0.0) for _ in range(4)]
    return [relay_over(cluster, "relayA", members[:2]), relay_over(cluster, "relayB",
                                                                    members[2:])]


def weights(cluster, run_id: str) -> dict[str, np.ndarray]:
    return load_model(cluster.workdir / "runs" / run_id / "model.npz")[0]


def test_two_relays_of_two_nodes_reproduce_the_assignment_with_a_token_and_tls(cluster,
                                                                             tmp_path):
    certs = make_certs(tmp_path / "certs")
    token = tmp_path / "trainer.token"
    token.write_text("relay-levels-token\n")
    flags = ["--token-file", str(token), "--tls-ca", str(certs.ca)]
    serving = [*flags, "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    members = [cluster.add_node(0.0, *serving) for _ in range(4)]
    relays = [relay_over(cluster, "relayA", members[:2], *serving),
              relay_over(cluster, "relayB", members[2:], *serving)]
    cluster.start_coordinator(2, *serving, nodes=relays)
    result = cluster.train_json(*ASSIGNMENT, *flags)
    assert [round(h["validation_error"], 4) for h in result["history"]] == [
        0.9574, 0.9277, 0.7954, 0.7720, 0.8054]  # bit for bit as flat nodes
    assert {n["node"] for n in result["nodes"]} == {f"127.0.0.1:{r.port}" for r in relays}
    for member in members:  # every member computed units, the token and TLS at both levels
        assert "done:" in member.log(), member.log()


def test_sync_sgd_through_relays_equals_the_flat_run_up_to_rounding(cluster):
    relays = two_relays_of_two(cluster)
    cluster.start_coordinator(2, "--deterministic", nodes=cluster.nodes[:4])
    flat = cluster.train_json(*SYNC_SGD, "--run-id", "flat")
    cluster.coordinator.stop()
    cluster.start_coordinator(2, "--deterministic", nodes=relays)
    through = cluster.train_json(*SYNC_SGD, "--run-id", "relayed")
    expected, got = weights(cluster, "flat"), weights(cluster, "relayed")
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-6)
    assert abs(through["validation_error"] - flat["validation_error"]) < 0.01
    logs = "".join(member.log() for member in cluster.nodes[:4])
    assert "~r0 round 1 done" in logs and "~r1 round 1 done" in logs  # units were split


def test_a_member_killed_mid_run_leaves_its_slices_to_the_other(cluster):
    members = [cluster.add_node(0.0) for _ in range(2)]
    relay = relay_over(cluster, "relay", members)
    cluster.start_coordinator(2, nodes=[relay])
    client = cluster.start_client(*SYNC_SGD, "--set", "run.rounds=12", "--quiet")
    try:
        members[1].wait_for(r"done:", timeout=60)
        members[1].kill()
        out, err = client.communicate(timeout=240)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, err + cluster.logs()
    assert "round 12/12" in cluster.coordinator.log()


def test_relays_nest(cluster):
    # Every process is warm before the run: a cold one loads torch for seconds on its
    # first unit, long past the quarter second after which the outer relay backs a slice
    # up on its other member, so the plain node could win every slice before the inner
    # relay's members saw one. The outer relay knows its tree (from its heartbeats)
    # before the run starts, as the run is shorter than a heartbeat's interval.
    warm = ["--warm-up", "mlp"]
    members = [cluster.add_node(0.0, *warm) for _ in range(2)]
    inner = relay_over(cluster, "inner", members, *warm)
    plain = cluster.add_node(0.0, *warm)
    outer = relay_over(cluster, "outer", [inner, plain], *warm)
    for process in [*members, inner, plain, outer]:
        # a node warms torch up for any model but the GANs; a relay waits for its nodes
        process.wait_for("warmed up for (torch|mlp)")
    outer_node = ThriftNodeClient(NodeAddress("127.0.0.1", outer.port), rpc_timeout=10.0,
                                  connect_timeout=5.0)
    try:
        assert wait_until(lambda: [m.role for m in outer_node.ping().members]
                          == ["relay of 2 nodes", None], 30.0)
    finally:
        outer_node.close()
    cluster.start_coordinator(2, nodes=[outer])
    result = cluster.train_json(*SYNC_SGD)
    assert result["units"]["done"] == 8
    for member in members:  # slices of slices: two levels down, on each member
        assert re.search(r"unit\S*~r\d+~r\d+ round", member.log()), member.log()
    assert [n["role"] for n in result["nodes"]] == ["relay of 2 nodes"]  # from its pings
    # the summary shows the tree, each relay's members with the counts its engine kept
    (top,) = result["nodes"]
    assert [(m["node"], m["role"]) for m in top["members"]] == [
        (f"127.0.0.1:{inner.port}", "relay of 2 nodes"), (f"127.0.0.1:{plain.port}", None)]
    assert [m["node"] for m in top["members"][0]["members"]] == [
        f"127.0.0.1:{m.port}" for m in members]
    # the outer relay's engine counted its members' answers (a backup on the quick plain
    # node may win a slice that the inner relay then answers as cancelled)
    assert all(m["accepted"] + m["cancelled"] > 0 for m in top["members"]), json.dumps(top)


def test_a_relay_listing_itself_is_refused(cluster):
    member = cluster.add_node(0.0)
    group = cluster.workdir / "self.txt"
    # the relay's own port is the one it is told to take: a line naming it is refused
    port = member.port + 1000
    group.write_text(f"127.0.0.1,{member.port}\nlocalhost,{port}\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "compute_node.py"), str(port), "0", "--host",
         "127.0.0.1", "--relay", str(group)],
        capture_output=True, text=True, timeout=60, env=procs.python_env())
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"localhost:{port} is this relay's own address" in done.stderr


def test_a_link_delay_holds_each_reply_upward(cluster):
    relay = relay_over(cluster, "relay", [cluster.add_node(0.0)], "--link-delay-ms", "100")
    cluster.start_coordinator(2, nodes=[relay])
    result = cluster.train_json("letters", "1", "1", "8", "0.01")
    # the coordinator's calls last the link's 0.1 s longer than the relay's maths
    (node,) = result["nodes"]
    assert node["busy_seconds"] - node["compute_seconds"] >= 11 * 0.1, node


def test_a_relay_trains_its_group_in_local_rounds(cluster):
    """hierarchy.relay_local_rounds = 3: each unit from above becomes 3 rounds of one share
    per member, and one update up; the coordinator counts its own rounds only."""
    members = [cluster.add_node(0.0) for _ in range(2)]
    relay = relay_over(cluster, "relay", members)
    cluster.start_coordinator(2, "--no-speculation", nodes=[relay])
    recommended = ["--config", str(REPO / "configs" / "letters_recommended.yaml"),
                   "--set", "run.rounds=2", "--set", "delta_avg.epochs=1"]
    result = cluster.train_json(*recommended, "--set", "hierarchy.relay_local_rounds=3",
                                timeout=300.0)
    assert result["rounds"] == 2 and result["units"]["done"] == 22
    assert result["validation_error"] < 0.6  # it learns (chance: 0.96)
    # every unit: 3 rounds of one share on each member, as the relay's engine counted
    (top,) = result["nodes"]
    assert sum(m["accepted"] for m in top["members"]) >= 22 * 3 * 2, top
    logs = [m.log() for m in members]
    assert all("~r" in log for log in logs)  # both members computed shares
    assert "~r0 round" in "".join(logs) and "~r1 round" in "".join(logs)
    refused = cluster.client(*SYNC_SGD, "--set", "hierarchy.relay_local_rounds=2")
    assert refused.returncode == 2
    assert "hierarchy.relay_local_rounds: sync_sgd cannot" in refused.stderr


def test_pull_members_join_a_relay_on_its_members_port(cluster):
    """A node that accepts no connections leases its slices from the relay, beside a
    pushed member, and the relay's pings count both."""
    pushed = cluster.add_node(0.0)
    relay = relay_over(cluster, "relay", [pushed], "--members-port", "0")
    members_port = int(relay.wait_for(r"members join on port (\d+)").group(1))
    pull = procs.start_pull_node(cluster.workdir, "pull1", members_port, 0.0)
    cluster.nodes.append(pull)  # stopped with the cluster
    relay.wait_for(r"node pull:pull1 registered")
    cluster.start_coordinator(2, nodes=[relay])
    result = cluster.train_json(*SYNC_SGD)
    assert result["units"]["done"] == 8
    (top,) = result["nodes"]
    assert top["role"] == "relay of 2 nodes"
    counts = {m["node"]: m["accepted"] for m in top["members"]}
    assert counts["pull:pull1"] > 0 and counts[f"127.0.0.1:{pushed.port}"] > 0, top
    refused = procs.run_client(["127.0.0.1", str(members_port), *SYNC_SGD], cluster.workdir)
    assert refused.returncode == 1 and "members port of relay" in refused.stderr


@pytest.mark.parametrize("spoilt, reason", [("nan", "NaN"), ("shape", "shape")])
def test_a_relay_benches_a_member_sending_wrong_updates_and_says_so(cluster, spoilt, reason):
    """As a coordinator does with its own nodes: the member's results are refused and the
    units go to the other member; the relay reports the refusal in its node tree."""
    honest = cluster.add_node(0.0)
    spoiler = cluster.add_node(0.0, "--corrupt-updates", spoilt)
    relay = relay_over(cluster, "relay", [honest, spoiler])
    # pinged often: the run's few seconds show the relay's tree (its pings carry it)
    cluster.start_coordinator(2, "--heartbeat", "0.2", nodes=[relay])
    result = cluster.train_json(*ASSIGNMENT, timeout=240.0)
    assert round(result["validation_error"], 4) == 0.8054  # nothing spoilt got in
    (top,) = result["nodes"]
    members = {m["node"]: m for m in top["members"]}
    bad = members[f"127.0.0.1:{spoiler.port}"]
    assert bad["failed"] >= 1 and bad["accepted"] == 0, top
    assert reason in (bad["refused"] or ""), top
    assert members[f"127.0.0.1:{honest.port}"]["refused"] is None
