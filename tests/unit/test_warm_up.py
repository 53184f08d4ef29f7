"""Nodes warm up (torch, the run's model) before round 1, answering pings meanwhile."""

from __future__ import annotations

import threading

from tests.inprocess import LocalNode
from tests.waiting import wait_until
from thrift_trainer.compute_node import warm_up as node_warm_up
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.engine.warm_up import warm_up_nodes
from thrift_trainer.training.models.names import BUILT_IN_MODELS, GAN_MODELS
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes


def test_a_node_warms_up_in_the_background_and_says_so_in_its_pings(monkeypatch):
    release = threading.Event()
    warmed: list[str] = []

    def slow_warm(model: str, device: str = "cpu") -> None:
        release.wait(10)
        warmed.append(model)

    monkeypatch.setattr(node_warm_up, "warm_model", slow_warm)
    node = LocalNode(0)
    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION, warm_up="dcgan28-tiny")
    assert node.handler.ping(ping).warming_up is True  # answered while warming
    assert node.handler.ping(ping).warming_up is True  # asked again: still the one warm-up
    release.set()
    assert wait_until(lambda: not node.handler.warm_up.busy, 10)
    assert warmed == ["dcgan28-tiny"]
    plain = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    assert node.handler.ping(plain).warming_up is False


def test_a_warm_up_for_a_model_the_node_cannot_build_is_refused_and_starts_nothing(
        monkeypatch):
    warmed: list[str] = []
    monkeypatch.setattr(node_warm_up, "warm_model",
                        lambda model, device="cpu": warmed.append(model))
    warm_up = node_warm_up.WarmUp()
    for name, words in (("m" * 65, "65 characters, longer than 64"),
                        ("no_such_model", "unknown model 'no_such_model'"),
                        ("evil:Net", "lacks plug-in evil: it allows no plug-in module; "
                                     "start it with --plugins evil")):
        problem = warm_up.start(name)
        assert problem is not None and words in problem, problem
    assert not warm_up.busy and warmed == []


def test_what_a_node_keeps_of_warm_ups_is_one_entry_per_gan_and_one_for_torch(monkeypatch):
    warmed: list[str] = []
    monkeypatch.setattr(node_warm_up, "warm_model",
                        lambda model, device="cpu": warmed.append(model))
    warm_up = node_warm_up.WarmUp()
    for _ in range(3):
        for name in (*GAN_MODELS, *BUILT_IN_MODELS):
            assert warm_up.start(name) is None
    assert wait_until(lambda: not warm_up.busy, 10)
    assert sorted(warmed) == sorted([*GAN_MODELS, node_warm_up.TORCH])


def test_warming_a_gan_builds_it_and_takes_a_backward_pass():
    node_warm_up.warm_model("dcgan28-tiny")  # raises if the model cannot be built or run


def test_round_one_waits_while_nodes_warm_up_and_progress_says_so(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(node_warm_up, "warm_model", lambda model, device="cpu": release.wait(10))
    nodes = [LocalNode(0), LocalNode(1)]
    progress = RunProgress("r1", 1, 1, list)
    messages: list[str | None] = []
    done = threading.Event()

    def run() -> None:
        warm_up_nodes(nodes, "dcgan28-tiny", progress, threading.Event(), poll_seconds=0.01)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert wait_until(lambda: progress.snapshot().message is not None, 10)
    messages.append(progress.snapshot().message)
    assert not done.is_set()
    release.set()
    assert done.wait(10)
    assert messages == ["nodes warming up: 0 of 2 ready"]
    assert progress.snapshot().message is None  # cleared for round 1


def test_the_wait_for_warming_nodes_is_bounded(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(node_warm_up, "warm_model", lambda model, device="cpu": release.wait(10))
    progress = RunProgress("r1", 1, 1, list)
    try:
        waited = warm_up_nodes([LocalNode(0)], "dcgan28-tiny", progress, threading.Event(),
                               max_seconds=0.05, poll_seconds=0.01)
    finally:
        release.set()
    assert 0.05 < waited < 5


def test_a_warm_up_answer_counts_as_a_heartbeat(monkeypatch):
    """A run shorter than the heartbeats' interval still knows its nodes from the warm-up."""
    monkeypatch.setattr(node_warm_up, "warm_model", lambda model, device="cpu": None)
    node = LocalNode(0)
    node.handler.role = "relay of 2 nodes"
    warm_up_nodes([node], "m", RunProgress("r1", 1, 1, list), threading.Event(),
                  poll_seconds=0.01)
    assert node.liveness.ever_heard
    assert node.summary().role == "relay of 2 nodes"
