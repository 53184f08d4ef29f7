"""A coordinator whose nodes are all down says so in a few lines, not hundreds."""

from __future__ import annotations

import re
from collections import Counter

LOG_LINE = re.compile(r"^\S+ \S+ coordinator (\w+) (.*)$")
MOST_REPEATS = 20  # a flood was hundreds of the same line; a summary keeps it to a handful


def _kinds(log: str) -> Counter:
    """Coordinator log lines by kind: level and text with every number masked."""
    kinds: Counter = Counter()
    for line in log.splitlines():
        if match := LOG_LINE.match(line):
            kinds[(match.group(1), re.sub(r"\d+", "N", match.group(2)))] += 1
    return kinds


def test_a_coordinator_with_every_node_down_does_not_flood_its_log(cluster):
    cluster.add_node(0.0, "--load-delay", "0.1")
    cluster.start_coordinator(2, "--grace", "6")
    client = cluster.start_client("letters", "50", "1", "20", "0.1", "--quiet",
                                  "--dead-after", "60")
    try:
        cluster.coordinator.wait_for(r"round 1/50", timeout=90)
        cluster.nodes[0].kill()  # every node of the run is gone: rounds cannot progress
        _, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
    assert client.returncode == 1, err
    cluster.coordinator.stop()  # at exit the open windows' summaries are written
    kinds = _kinds(cluster.coordinator.log())
    (level, text), count = kinds.most_common(1)[0]
    assert count <= MOST_REPEATS, f"{count} x {level} {text}\n{cluster.logs()[-3000:]}"
