"""Before round 1: which nodes can serve the run (its plug-ins, model and data set).

A run that names a plug-in or trains a torch model asks every pushed node, in parallel,
what it makes of the run (`ComputeNode.check_run`: its plug-ins with their versions, and
fingerprints of the model and of its copy of the data set) and compares that with what the
coordinator built (training/run_check.py). A node that cannot serve the run is left out,
with one line that the client, `status` and the dashboard show. A node that does not
answer is left to the round engine, which deals with silent nodes anyway; pull nodes and
relays' members check themselves with their first unit (the units carry the fingerprints).
"""

from __future__ import annotations

import logging

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.client import RunQuery
from thrift_trainer.engine.nodes.errors import NodeError
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.progress import RunProgress
from thrift_trainer.training.run_check import RunFacts, unfit_reason
from thrift_trainer.training.spec import RunSpec

log = logging.getLogger("coordinator")


def check_nodes(nodes: list[NodeHandle], query: RunQuery, facts: RunFacts, spec: RunSpec,
                progress: RunProgress, stop: runtime.EventLike) -> list[NodeHandle]:
    """Ask the pushed nodes; returns those that cannot serve the run, each marked
    `left_out` with its reason."""
    if stop.is_set() or not any(n.accepts_connections for n in nodes):
        return []
    progress.waiting(f"checking that {len(nodes)} node(s) can serve the run")
    try:
        problems = node_problems(nodes, query, facts, spec)
    finally:
        progress.waiting(None)
    unfit = []
    for node, reason in problems.items():
        if node.leave_out(reason):
            log.warning("node %s is left out of run %s: %s", node.name, query.run_id, reason)
            unfit.append(node)
    return unfit


def node_problems(nodes: list[NodeHandle], query: RunQuery, expected: RunFacts | dict,
                  spec: RunSpec) -> dict[NodeHandle, str]:
    """The pushed nodes that cannot serve the run, asked in parallel, each with why;
    ``expected``: the coordinator's facts (or a unit's ``expect``)."""
    pushed = [n for n in nodes if n.accepts_connections]
    if not pushed:
        return {}
    reasons = runtime.parallel_map(lambda node: _reason(node, query, expected, spec), pushed,
                                   threads=16, name="check")
    return {node: reason for node, reason in zip(pushed, reasons, strict=True)
            if reason is not None}


def _reason(node: NodeHandle, query: RunQuery, facts: RunFacts | dict,
            spec: RunSpec) -> str | None:
    """Why the node cannot serve the run, or None (also when it cannot be asked)."""
    try:
        answer = node.client.check_run(query)
    except NodeError as exc:  # silent, or a node too old to be asked: the engine decides
        log.info("node %s could not be checked: %s", node.name, exc)
        return None
    if answer is None:
        return None
    node.liveness.heard()
    if answer.problem is not None:
        return answer.problem
    node.clients_checked = True
    if answer.facts is None:
        return None
    if answer.facts.clients is not None:  # it holds only these clients' data
        node.clients = frozenset(answer.facts.clients)
    if not answer.facts.model_fingerprint:  # it built no torch model: nothing to compare
        return None
    if spec.clients.on_nodes:  # its own data is its clients
        reason = _take_own_clients(node, answer.facts)
        if reason is not None:
            return reason
    return unfit_reason(facts, answer.facts, spec)


def _take_own_clients(node: NodeHandle, facts: RunFacts) -> str | None:
    """Node-resident clients: the names, sizes, label counts and fingerprints the node
    announced, kept on its handle; why it cannot serve the run, or None."""
    names = facts.clients or ()
    sizes = {name: facts.own_sizes.get(name, 0) for name in names}
    if not names or sum(sizes.values()) < 1 or set(facts.own_sizes) != set(names):
        return "announces no client of its own data (is it an older node?)"
    # Added to what it announced before: a client it no longer holds (a relay's member
    # that died) stays one of the run's clients, and drops out while no node holds it.
    node.client_sizes = {**node.client_sizes, **sizes}
    node.client_labels = {**node.client_labels,
                          **{name: facts.own_labels.get(name) for name in names}}
    node.client_fingerprints = {**node.client_fingerprints,
                                **{name: facts.own_fingerprints.get(name, "")
                                   for name in names}}
    return None
