"""Enough nodes to train: waiting for them at the start, pausing when too few answer.

A run may need a minimum of nodes (`--min-nodes`). With `--pause-below-min`, a run
whose answering nodes drop below it stops handing out units and shows "waiting for
nodes" in its status until enough answer again (a node restarted on its address,
one added to the nodes file or registered), for at most `--max-pause` seconds;
without it, the run fails once too few nodes have answered for `--grace` seconds.
`--wait-for-nodes N` holds the first round until N nodes have answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.progress import RunProgress

log = logging.getLogger("coordinator.engine")

WAITING = "waiting for nodes"


class TooFewNodes(Exception):
    """Too few nodes answered for longer than the run may wait."""

    def __init__(self, message: str, nodes_tried: list[str]) -> None:
        super().__init__(message)
        self.nodes_tried = nodes_tried


@dataclass(frozen=True)
class NodeMinimum:
    min_nodes: int = 1
    pause: bool = False  # pause below the minimum (else fail after `grace`)
    max_pause: float = 600.0
    grace: float = 30.0

    @property
    def active(self) -> bool:
        """With the defaults the engine's own grace check (no node answering) applies."""
        return self.pause or self.min_nodes > 1


def answering(nodes: list[NodeHandle], now: float, heard_only: bool = False) -> int:
    """Nodes not dead; with `heard_only`, only those that have answered at least once."""
    return sum(1 for n in nodes if n.liveness.state(now) != "dead"
               and (n.liveness.ever_heard or not heard_only))


class NodeGate:
    """Open while enough nodes answer; `watch()` pauses, resumes or fails the run."""

    def __init__(self, minimum: NodeMinimum, progress: RunProgress) -> None:
        self.minimum = minimum
        self.progress = progress
        self._open = runtime.Event()
        self._open.set()
        self._below_since: float | None = None

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    def wait_open(self, timeout: float) -> bool:
        """True once units may be handed out; False after `timeout` while paused."""
        return self._open.wait(timeout)

    def watch(self, nodes: list[NodeHandle], now: float) -> None:
        """Check the answering nodes against the minimum; TooFewNodes when waited too long."""
        if not self.minimum.active:
            return
        live = answering(nodes, now)
        if live >= self.minimum.min_nodes:
            if self._below_since is not None:
                self._resume(live)
            return
        if self._below_since is None:
            self._below_since = now
            log.warning("only %d of at least %d nodes answer%s", live, self.minimum.min_nodes,
                        ": run paused" if self.minimum.pause else "")
        waited = now - self._below_since
        if self.minimum.pause:
            self._open.clear()
            self.progress.waiting(waiting_message(live, self.minimum.min_nodes, waited,
                                                  self.minimum.max_pause))
        limit, flag = ((self.minimum.max_pause, "--max-pause") if self.minimum.pause
                       else (self.minimum.grace, "--grace"))
        if waited > limit:
            names = [n.name for n in nodes]
            raise TooFewNodes(f"fewer than {self.minimum.min_nodes} compute nodes answered for "
                              f"{waited:.0f}s ({flag} {limit:g}); {live} answering of "
                              f"{', '.join(names) or 'none'}", names)

    def _resume(self, live: int) -> None:
        log.info("%d nodes answer again: run continues after %.0fs", live,
                 runtime.monotonic() - (self._below_since or runtime.monotonic()))
        self._below_since = None
        self.progress.waiting(None)
        self._open.set()


def waiting_message(live: int, needed: int, waited: float, limit: float) -> str:
    return (f"{WAITING}: {live} of at least {needed} answering (waited {waited:.0f}s of at "
            f"most {limit:g}s)")


def wait_for_nodes(count: int, nodes: Callable[[], list[NodeHandle]],
                   refresh: Callable[[], object], progress: RunProgress,
                   stop: runtime.EventLike, max_wait: float, step: float) -> None:
    """Block until `count` nodes have answered (refreshing the node list every `step`
    seconds) or `stop` is set; TooFewNodes after `max_wait` seconds."""
    started = runtime.monotonic()
    while not stop.is_set():
        refresh()
        waited = runtime.monotonic() - started
        live = answering(nodes(), runtime.monotonic(), heard_only=True)
        if live >= count:
            progress.waiting(None)
            return
        if waited > max_wait:
            names = [n.name for n in nodes()]
            raise TooFewNodes(f"only {live} of the {count} compute nodes the run waits for "
                              f"(--wait-for-nodes) answered within {max_wait:g}s "
                              f"(--max-pause); known: {', '.join(names) or 'none'}", names)
        progress.waiting(waiting_message(live, count, waited, max_wait))
        stop.wait(step)
