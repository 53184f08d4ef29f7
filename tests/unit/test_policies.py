"""Scheduling policies: pure functions of node views and a seeded generator."""

from __future__ import annotations

import pytest

from thrift_trainer.engine.policies import (
    AdaptivePolicy,
    NodeView,
    Priors,
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


def test_adaptive_prefers_nodes_that_accept_and_do_not_delay():
    nodes = [
        NodeView(0, admitted=10, rejected=40, delayed=8, compute_seconds=0.03,
                 delay_seconds=3.0),  # load 0.8: rejects and delays
        NodeView(1, admitted=40, rejected=10, delayed=8, compute_seconds=0.03,
                 delay_seconds=3.0),  # load 0.2: the best
        NodeView(2, admitted=40, rejected=10, delayed=8, compute_seconds=0.03,
                 delay_seconds=3.0, in_flight=30),  # as good, but 30 units queued
    ]
    assert AdaptivePolicy(0).order(nodes) == [1, 2, 0]


def test_adaptive_assumes_unmeasured_nodes_are_typical():
    measured = NodeView(0, admitted=8, delayed=0, compute_seconds=0.1, delay_seconds=2.0)
    fresh = NodeView(1)
    prior = Priors.of([measured, fresh])
    assert prior == Priors(compute_seconds=0.1, delay_seconds=2.0)
    assert expected_seconds(fresh, prior) == pytest.approx(0.1 + 0.5 * 2.0 + 0.002)
    assert AdaptivePolicy(0).order([measured, fresh]) == [0, 1]


def test_unknown_policy_number_lists_the_known_ones():
    with pytest.raises(ValueError, match="1 random, 2 load balancing, 3 adaptive"):
        make_policy(9)
