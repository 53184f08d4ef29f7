"""devtools/throughput.py: the units' order and what is read from the logs of a run
(no process is started)."""

from __future__ import annotations

import itertools

import pytest

from devtools.throughput import ClusterRun, PathResult, round_times, unit_ranges

ROUND = "2026-11-25 16:00:{} coordinator INFO round {}/3: validation error {} (2 units, 0 " \
    "discarded, 0.5s)\n"
COORDINATOR_LOG = ("2026-11-25 16:00:00,000 coordinator INFO run abc: sync_sgd/m on mnist\n"
                   + ROUND.format("01,250", 1, "nan") + ROUND.format("01,750", 2, "nan")
                   + ROUND.format("02,000", 3, "0.1000"))
NODE_LOGS = ["2026-11-25 16:00:01,200 node INFO unit unit0-0-10 round 1 done: 10 samples in "
             "1.100s\n2026-11-25 16:00:01,700 node INFO unit unit2-20-30 round 2 done: 10 "
             "samples in 0.400s\n",
             "2026-11-25 16:00:01,700 node INFO unit unit3-30-40 round 2 done: 10 samples in "
             "0.450s\n"]


def test_units_walk_the_data_in_order_and_wrap_at_its_end() -> None:
    assert list(itertools.islice(unit_ranges(25, 10, 0, 1), 4)) == [
        (0, 10), (10, 20), (20, 25), (0, 10)]
    assert list(itertools.islice(unit_ranges(25, 10, 1, 2), 3)) == [(10, 20), (0, 10), (20, 25)]


def test_the_round_times_and_unit_times_come_from_the_logs() -> None:
    ends = round_times(COORDINATOR_LOG)
    assert sorted(ends) == [1, 2, 3]
    assert ends[2] - ends[1] == pytest.approx(0.5) and ends[3] - ends[2] == pytest.approx(0.25)
    run = ClusterRun({}, COORDINATOR_LOG, NODE_LOGS)
    assert run.round_ends() == ends
    assert run.unit_seconds_by_round() == {1: [1.1], 2: [0.4, 0.45]}
    assert run.unit_seconds() == [0.4, 0.45] and run.unit_seconds(first_round=1)[0] == 1.1


def test_a_paths_rate_counts_its_global_batches() -> None:
    result = PathResult("x", 2, 128, 10, 4.0)
    assert result.per_second == 320 and result.updates_per_second == 2.5
