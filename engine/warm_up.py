"""Before round 1: nodes load torch and build the run's model, off round 1's clock.

A torch run asks every pushed node to warm up for its model (in the ping, see
compute_node/warm_up.py) and waits while any of them reports it is still warming, at
most WARM_UP_MAX_SECONDS; status and the client's progress say "nodes warming up"
meanwhile. A node that does not answer is left to the round engine, which deals with
silent nodes anyway; pull nodes (which take no pings) warm up with their first unit.
"""

from __future__ import annotations

import logging

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.progress import RunProgress

log = logging.getLogger("coordinator")
WARM_UP_MAX_SECONDS = 300.0  # then round 1 starts anyway, with the nodes still warming
POLL_SECONDS = 0.5


def warm_up_nodes(nodes: list[NodeHandle], model: str, progress: RunProgress,
                  stop: runtime.EventLike, max_seconds: float = WARM_UP_MAX_SECONDS,
                  poll_seconds: float = POLL_SECONDS) -> float:
    """Ask the nodes to warm up for `model`, wait while any is warming; returns the
    seconds waited."""
    pushed = [n for n in nodes if n.accepts_connections]
    began = runtime.monotonic()
    if not pushed:
        return 0.0
    while not stop.is_set():
        warming = sum(runtime.parallel_map(lambda node: _warming(node, model), pushed,
                                           threads=16, name="warm-up"))
        waited = runtime.monotonic() - began
        if warming == 0:
            break
        if waited > max_seconds:
            log.warning("%d node(s) still warming up after %.0fs; round 1 starts", warming,
                        waited)
            break
        progress.waiting(f"nodes warming up: {len(pushed) - warming} of {len(pushed)} "
                         "ready")
        stop.wait(poll_seconds)
    progress.waiting(None)
    waited = runtime.monotonic() - began
    if waited >= poll_seconds:
        log.info("nodes warmed up for %s in %.1fs", model, waited)
    return waited


def _warming(node: NodeHandle, model: str) -> bool:
    """Whether the node is still warming up. Its answer counts as a heartbeat: a run
    shorter than the heartbeats' interval still knows which of its nodes are relays (a
    silent node is the round engine's to handle)."""
    info = node.heartbeat(warm_up=model)
    return info is not None and info.warming_up
