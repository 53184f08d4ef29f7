"""Pausing below a minimum of answering nodes, resuming, failing, and waiting to start."""

from __future__ import annotations

import threading
import time

import pytest

from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.quorum import (
    NodeGate,
    NodeMinimum,
    TooFewNodes,
    answering,
    wait_for_nodes,
)
from thrift_trainer.engine.progress import RunProgress


class FakeNode:
    def __init__(self, name: str, dead_after: float) -> None:
        self.name = name
        self.liveness = Liveness(suspect=dead_after / 2, dead=dead_after)


def progress() -> RunProgress:
    return RunProgress("r1", 3, 2, lambda: [])


def test_a_paused_gate_waits_for_nodes_and_opens_when_enough_answer_again():
    steady, flaky = FakeNode("a", 100.0), FakeNode("b", 1.0)
    shown = progress()
    gate = NodeGate(NodeMinimum(min_nodes=2, pause=True, max_pause=60.0), shown)
    t0 = time.monotonic()
    gate.watch([steady, flaky], t0)
    assert not gate.paused
    gate.watch([steady, flaky], t0 + 5)  # b silent for 5s: dead
    assert gate.paused and not gate.wait_open(0.01)
    assert shown.snapshot().message.startswith("waiting for nodes: 1 of at least 2 answering")
    assert shown.snapshot().state == "running"
    flaky.liveness.heard()
    gate.watch([steady, flaky], time.monotonic())
    assert not gate.paused and gate.wait_open(0.0)
    assert shown.snapshot().message is None


def test_a_pause_longer_than_max_pause_fails_with_the_flag_named():
    nodes = [FakeNode("a", 100.0), FakeNode("b", 1.0)]
    gate = NodeGate(NodeMinimum(min_nodes=2, pause=True, max_pause=10.0), progress())
    t0 = time.monotonic()
    gate.watch(nodes, t0 + 5)
    with pytest.raises(TooFewNodes, match=r"fewer than 2 compute nodes answered for 11s "
                                          r"\(--max-pause 10\); 1 answering of a, b"):
        gate.watch(nodes, t0 + 16)


def test_without_pause_too_few_nodes_fail_the_run_after_grace_and_work_goes_on_until():
    nodes = [FakeNode("a", 100.0), FakeNode("b", 1.0)]
    gate = NodeGate(NodeMinimum(min_nodes=2, pause=False, grace=30.0), progress())
    t0 = time.monotonic()
    gate.watch(nodes, t0 + 5)
    assert not gate.paused
    with pytest.raises(TooFewNodes, match=r"\(--grace 30\)"):
        gate.watch(nodes, t0 + 40)


def test_the_default_minimum_leaves_failing_to_the_engine_grace_check():
    gate = NodeGate(NodeMinimum(), progress())
    gate.watch([FakeNode("a", 1.0)], time.monotonic() + 1000)
    assert not gate.paused


def test_only_nodes_that_answered_count_for_the_start():
    heard, silent = FakeNode("a", 100.0), FakeNode("b", 100.0)
    heard.liveness.heard()
    now = time.monotonic()
    assert answering([heard, silent], now) == 2
    assert answering([heard, silent], now, heard_only=True) == 1


def test_wait_for_nodes_returns_once_enough_answer_and_fails_after_max_wait():
    nodes = [FakeNode("a", 100.0), FakeNode("b", 100.0)]
    nodes[0].liveness.heard()
    shown, stop = progress(), threading.Event()

    def answer_on_refresh() -> None:  # the second node answers once the wait has looked
        if shown.snapshot().message:
            nodes[1].liveness.heard()

    wait_for_nodes(2, lambda: nodes, answer_on_refresh, shown, stop, max_wait=30.0, step=0.01)
    assert shown.snapshot().message is None
    with pytest.raises(TooFewNodes, match=r"only 2 of the 3 compute nodes .* within 0.05s"):
        wait_for_nodes(3, lambda: nodes, lambda: None, shown, stop, max_wait=0.05, step=0.01)
