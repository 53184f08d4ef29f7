"""Scheduling policies: pure functions of node views and a seeded generator."""

from __future__ import annotations

import pytest

from coordinator.policies import (
    AdaptivePolicy,
    NodeView,
    RandomPolicy,
    RoundRobinPolicy,
    expected_seconds,
    make_policy,
)


def views(n: int, **overrides) -> list[NodeView]:
    return [NodeView(index=i, **overrides) for i in range(n)]


def test_round_robin_starts_one_node_further_each_call():
    policy = RoundRobinPolicy()
    orders = [policy.order(views(3)) for _ in range(4)]
    assert orders == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_policies_leave_out_benched_nodes():
    nodes = [NodeView(0), NodeView(1, available=False), NodeView(2)]
    for policy in (RandomPolicy(1), RoundRobinPolicy(), AdaptivePolicy(1)):
        assert sorted(policy.order(nodes)) == [0, 2]
    assert RoundRobinPolicy().order([NodeView(0, available=False)]) == []


def test_random_policy_is_a_seeded_permutation():
    first = [RandomPolicy(7).order(views(5)) for _ in range(3)]
    assert all(sorted(order) == list(range(5)) for order in first)
    assert RandomPolicy(7).order(views(5)) == first[0]
    seen = {tuple(RandomPolicy(seed).order(views(5))) for seed in range(20)}
    assert len(seen) > 5


def test_adaptive_prefers_nodes_that_accept_and_answer_fast():
    nodes = [
        NodeView(0, accepted=2, rejected=8, mean_seconds=3.0),  # busy and slow
        NodeView(1, accepted=9, rejected=1, mean_seconds=0.05),  # the best
        NodeView(2, accepted=9, rejected=1, mean_seconds=0.05, in_flight=3),  # queued up
    ]
    assert AdaptivePolicy(0).order(nodes) == [1, 2, 0]


def test_adaptive_tries_unmeasured_nodes_at_the_measured_mean():
    measured = NodeView(0, accepted=5, mean_seconds=1.0)
    fresh = NodeView(1)
    assert expected_seconds(fresh, prior_seconds=1.0) == pytest.approx(2.0)
    assert AdaptivePolicy(0).order([measured, fresh])[0] == 0


def test_unknown_policy_number_lists_the_known_ones():
    with pytest.raises(ValueError, match="1 random, 2 load balancing, 3 adaptive"):
        make_policy(9)
