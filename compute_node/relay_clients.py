"""What a relay announces of its members' node-resident clients (``clients.placement:
nodes``): a relay holds its members' clients.

At a run check the relay asks its members what they hold (engine/node_checks.py keeps each
member's announcement on its handle) and answers the coordinator with the union of the
clients of the members alive now, so a member that dies takes its clients out of the
relay's answer until it is back. Two members announcing one name with different data are
treated as the coordinator treats two nodes: the later member (in the group's order) is
left out of the run's clients, with one line in the relay's log, and the relay sends it
none of their units.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.training.clients.announced import Announcement, Clients
from thrift_trainer.wire.generated import ttypes

log = logging.getLogger("compute_node.relay")

LOGGED_RUNS = 16  # runs whose conflicts a relay remembers having logged


class MemberClients:
    """The union of a relay's live members' node-resident clients, per run check."""

    def __init__(self) -> None:
        self._logged: OrderedDict[str, set[tuple[str, str]]] = OrderedDict()
        self._lock = threading.Lock()

    def gather(self, run_id: str, members: list[NodeHandle]) -> Clients:
        """The clients of the ``members`` that are alive and announced some, in the
        group's order; a member that conflicts with an earlier one holds none of them."""
        clients = Clients()
        for member in members:
            if not _announces(member):
                continue
            conflict = clients.take(_announcement(member))
            if conflict is not None:
                member.clients = frozenset()  # none of the run's client units go to it
                self._log_once(run_id, member.name, conflict.client,
                               f"member {member.name} is left out of run {run_id}: "
                               f"{conflict}")
        return clients

    def _log_once(self, run_id: str, member: str, client: str, line: str) -> None:
        """One line per run, member and client: checks repeat as members come and go."""
        with self._lock:
            seen = self._logged.pop(run_id, set())
            self._logged[run_id] = seen
            while len(self._logged) > LOGGED_RUNS:
                self._logged.popitem(last=False)
            if (member, client) in seen:
                return
            seen.add((member, client))
        log.warning("%s", line)


def _announces(member: NodeHandle) -> bool:
    """Whether the member counts for the announcement: alive, checked, with clients."""
    return (member.clients_checked and bool(member.clients) and
            member.liveness.state() == "alive")


def _announcement(member: NodeHandle) -> Announcement:
    """The clients the member holds now, as its last check announced them."""
    held = member.clients if member.clients is not None else member.client_sizes
    return Announcement(member.name,
                        {name: size for name, size in member.client_sizes.items()
                         if name in held},
                        member.client_labels, member.client_fingerprints)


def announced(answer: ttypes.RunCheck, clients: Clients,
              model_fingerprint: str | None) -> ttypes.RunCheck:
    """The relay's run check answer with its members' clients: their names, examples,
    label counts (those not kept private) and data fingerprints. Holding none now, it
    says so (an empty list) without a model fingerprint, so that the coordinator keeps
    the relay in the run and sends it no client's unit until a member holds one again."""
    names = sorted(clients.sizes)
    answer.clients = names
    if not names or not model_fingerprint:
        return answer
    answer.model_fingerprint = model_fingerprint
    answer.client_sizes = {name: clients.sizes[name] for name in names}
    answer.client_labels = {name: json.dumps(counts) for name, counts in
                            clients.labels.items() if counts is not None}
    answer.client_fingerprints = clients.fingerprints()
    return answer
