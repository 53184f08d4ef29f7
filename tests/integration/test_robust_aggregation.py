"""Robust aggregation through real processes: a Byzantine node against mean and median."""

from __future__ import annotations

from devtools.local_cluster import REPO

RECIPE = str(REPO / "configs" / "letters_recommended.yaml")


def train(cluster, rule: str) -> dict:
    return cluster.train_json("--config", RECIPE, "--set", "run.rounds=3", "--set",
                              f"aggregation.rule={rule}", "--run-id", f"byzantine-{rule}",
                              timeout=300)


def test_median_outlasts_a_sign_flipping_node_that_wrecks_the_mean(cluster):
    for _ in range(4):
        cluster.add_node(0.0)
    byzantine = cluster.add_node(0.0, "--corrupt-updates", "signflip")
    # No norm guard: the aggregation rule alone faces the flipped updates.
    cluster.start_coordinator(2, "--max-update-norm", "0")
    median, mean = train(cluster, "median"), train(cluster, "mean")
    by_node = {n["node"]: n for n in median["nodes"]}
    assert by_node[f"127.0.0.1:{byzantine.port}"]["accepted"] >= 1, cluster.logs()
    # After 3 rounds an honest run is near 0.2; flipped updates in the mean leave it at
    # chance (0.96 for 26 letters).
    assert median["validation_error"] < 0.4, cluster.logs()
    assert mean["validation_error"] > median["validation_error"] + 0.4


def test_a_krum_setting_the_round_cannot_meet_is_refused_before_the_run(cluster):
    cluster.add_node(0.0)
    cluster.start_coordinator(2)
    done = cluster.client("--config", RECIPE, "--set", "aggregation.rule=krum", "--set",
                          "aggregation.krum_keep=9", "--run-id", "bad-krum")
    assert done.returncode != 0
    assert "'aggregation.krum_keep'" in done.stderr and "n - 2f - 2 = 7" in done.stderr
    assert "round 1" not in cluster.coordinator.log()
