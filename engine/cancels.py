"""Cancels of attempts no longer wanted, sent off the round's critical path.

A cancel is advisory, and a frozen node (SIGSTOP) keeps its socket open and takes a whole
control timeout to not answer. Cancels therefore go out on threads of their own, several
at once, and the round never waits for them. A node that is not alive when its cancel's
turn comes is skipped: it cannot be told, and its attempts end by their deadline or when
it is declared dead. One sender serves the whole process, so runs do not leak threads.
A run waits for the cancels it queued (`wait_sent`, bounded) before it closes its node
connections: the round does not wait for a unit it no longer needs, and the cancel that
frees the node must still go out when that unit was the run's last.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from thrift_trainer.engine import runtime

log = logging.getLogger("engine.cancels")

CANCEL_THREADS = 8
END_OF_RUN_WAIT_SECONDS = 5.0  # a control call's timeout: the longest one cancel takes


class Cancellable(Protocol):
    name: str

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None: ...

    def can_be_told(self) -> bool: ...


class CancelSender:
    """A queue of cancels served by `threads` daemon threads."""

    def __init__(self, threads: int = CANCEL_THREADS) -> None:
        self._queue: deque[tuple[Cancellable, str, str, int | None]] = deque()
        self._counts = runtime.Condition()  # guards the queue and the counts
        self._queued = 0
        self._served = 0  # sent, failed or skipped
        for i in range(threads):
            runtime.start_thread(self._serve, f"cancel-{i}")

    def send(self, node: Cancellable, run_id: str, unit_id: str,
             attempt: int | None = None) -> None:
        """Queue a cancel of the unit's attempts on `node` (one attempt when given)."""
        with self._counts:
            self._queued += 1
            self._queue.append((node, run_id, unit_id, attempt))
            self._counts.notify_all()

    def wait_sent(self, timeout: float) -> bool:
        """Wait until every cancel queued so far has been taken up (FIFO: as many have
        been served, i.e. sent, failed or skipped), at most ``timeout`` seconds; whether
        they all were."""
        deadline = runtime.monotonic() + timeout
        with self._counts:
            target = self._queued
            while self._served < target:
                left = deadline - runtime.monotonic()
                if left <= 0:
                    return False
                self._counts.wait(left)
        return True

    def _serve(self) -> None:
        while True:
            with self._counts:
                while not self._queue:
                    self._counts.wait()
                node, run_id, unit_id, attempt = self._queue.popleft()
            try:
                self._deliver(node, run_id, unit_id, attempt)
            finally:
                with self._counts:
                    self._served += 1
                    self._counts.notify_all()

    @staticmethod
    def _deliver(node: Cancellable, run_id: str, unit_id: str, attempt: int | None) -> None:
        if not node.can_be_told():
            log.debug("not cancelling %s on %s: the node is not answering", unit_id,
                      node.name)
            return
        try:
            node.cancel(run_id, unit_id, attempt)
        except Exception:  # noqa: BLE001 - a sender thread must outlive any node
            log.exception("cancel of %s on %s failed", unit_id, node.name)


def shared_sender() -> CancelSender:
    """The process's cancel sender, started on first use."""
    return runtime.process_singleton("cancel-sender", CancelSender)
