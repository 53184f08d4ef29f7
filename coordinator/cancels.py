"""Cancels of attempts no longer wanted, sent off the round's critical path.

A cancel is advisory, and a frozen node (SIGSTOP) keeps its socket open and takes a whole
control timeout to not answer. Cancels therefore go out on threads of their own, several
at once, and the round never waits for them. A node that is not alive when its cancel's
turn comes is skipped: it cannot be told, and its attempts end by their deadline or when
it is declared dead. One sender serves the whole process, so runs do not leak threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

log = logging.getLogger("coordinator.cancels")

CANCEL_THREADS = 8


class Cancellable(Protocol):
    name: str

    def cancel(self, run_id: str, unit_id: str, attempt: int | None = None) -> None: ...

    def can_be_told(self) -> bool: ...


class CancelSender:
    """A queue of cancels served by `threads` daemon threads."""

    def __init__(self, threads: int = CANCEL_THREADS) -> None:
        self._queue: queue.SimpleQueue[tuple[Cancellable, str, str, int | None]] = (
            queue.SimpleQueue())
        for i in range(threads):
            threading.Thread(target=self._serve, name=f"cancel-{i}", daemon=True).start()

    def send(self, node: Cancellable, run_id: str, unit_id: str,
             attempt: int | None = None) -> None:
        """Queue a cancel of the unit's attempts on `node` (one attempt when given)."""
        self._queue.put((node, run_id, unit_id, attempt))

    def _serve(self) -> None:
        while True:
            node, run_id, unit_id, attempt = self._queue.get()
            if not node.can_be_told():
                log.debug("not cancelling %s on %s: the node is not answering", unit_id,
                          node.name)
                continue
            try:
                node.cancel(run_id, unit_id, attempt)
            except Exception:  # noqa: BLE001 - a sender thread must outlive any node
                log.exception("cancel of %s on %s failed", unit_id, node.name)


_shared: CancelSender | None = None
_shared_lock = threading.Lock()


def shared_sender() -> CancelSender:
    """The process's cancel sender, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CancelSender()
        return _shared
