"""The plug-ins of examples/plugins through real processes, as their README runs them:
FedProx trains a torch model, SignSGD sends about a bit per entry, and the geometric
median outlasts a sign-flipping node."""

from __future__ import annotations

from devtools.local_cluster import REPO

EXAMPLES = REPO / "examples" / "plugins"
PLUGINS = ("--plugins", "fedprox,geomedian,signsgd", "--plugin-dir", str(EXAMPLES))
RECOMMENDED = str(REPO / "configs" / "letters_recommended.yaml")
UPDATE_BYTES = 22_042 * 8  # a letters MLP update: hidden [128, 128], float64 entries
CHANCE = 0.96  # the validation error of guessing among the 26 letters


def test_fedprox_trains_and_signsgd_sends_a_bit_per_entry(cluster):
    for _ in range(2):
        cluster.add_node(0.0, *PLUGINS)
    cluster.start_coordinator(2, *PLUGINS)
    fedprox = cluster.train_json("--config", str(EXAMPLES / "fedprox.yaml"),
                                 "--set", "run.rounds=2", "--run-id", "fedprox", timeout=300)
    errors = [r["validation_error"] for r in fedprox["history"]]
    assert errors[-1] < errors[0] < CHANCE / 2, errors

    signsgd = cluster.train_json("--config", RECOMMENDED, "--set", "run.rounds=3",
                                 "--set", "compression.up=signsgd:SignSGD",
                                 "--run-id", "signsgd", timeout=300)
    assert signsgd["compression"]["up"] == "signsgd:SignSGD"
    units = 3 * 11  # an update per letters file and round
    # 1 bit instead of 64 per entry, plus each tensor's name, scale and shape
    assert signsgd["bytes_up"] < units * UPDATE_BYTES / 40
    assert signsgd["validation_error"] < CHANCE / 2, signsgd["history"]


def test_the_geometric_median_outlasts_a_sign_flipping_node(cluster):
    for _ in range(3):
        cluster.add_node(0.0, *PLUGINS)
    byzantine = cluster.add_node(0.0, *PLUGINS, "--corrupt-updates", "signflip")
    # No norm guard: the aggregation rule alone faces the flipped updates.
    cluster.start_coordinator(2, "--max-update-norm", "0", *PLUGINS)
    result = cluster.train_json("--config", RECOMMENDED, "--set", "run.rounds=3",
                                "--set", "aggregation.rule=geomedian:geometric_median",
                                "--run-id", "geomedian", timeout=300)
    by_node = {n["node"]: n for n in result["nodes"]}
    assert by_node[f"127.0.0.1:{byzantine.port}"]["accepted"] >= 1, cluster.logs()
    # An honest run is near 0.2 after 3 rounds; the mean of these updates stays at chance
    # (tests/integration/test_robust_aggregation.py).
    assert result["validation_error"] < 0.4, result["history"]
    assert "aggregated 11 updates by geomedian:geometric_median" in cluster.coordinator.log()
