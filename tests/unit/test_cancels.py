"""The cancel sender: cancels go out off the caller's path, and a run can wait for them
before it closes its node connections."""

from __future__ import annotations

import threading

from thrift_trainer.engine.cancels import CancelSender


class SlowNode:
    """A node whose cancels wait until the test lets them through."""

    def __init__(self, name: str, answering: bool = True) -> None:
        self.name = name
        self.answering = answering
        self.released = threading.Event()
        self.cancelled: list[tuple[str, str, int | None]] = []

    def can_be_told(self) -> bool:
        return self.answering

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
        self.released.wait(30)
        self.cancelled.append((run_id, unit_id, attempt))


def test_wait_sent_returns_once_every_queued_cancel_went_out() -> None:
    sender, node = CancelSender(threads=2), SlowNode("a")
    sender.send(node, "r1", "u1")
    sender.send(node, "r1", "u2", 3)
    assert not sender.wait_sent(0.05)  # both still held by the node
    node.released.set()
    assert sender.wait_sent(30)
    assert sorted(node.cancelled) == [("r1", "u1", None), ("r1", "u2", 3)]


def test_skipped_and_failed_cancels_count_as_served() -> None:
    class Broken(SlowNode):
        def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None:
            raise OSError("connection reset")

    sender = CancelSender(threads=1)
    sender.send(SlowNode("silent", answering=False), "r1", "u1")
    sender.send(Broken("broken"), "r1", "u2")
    assert sender.wait_sent(30)


def test_nothing_queued_means_nothing_to_wait_for() -> None:
    assert CancelSender(threads=1).wait_sent(0)
