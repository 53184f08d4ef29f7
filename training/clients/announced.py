"""Node-resident clients as their nodes announce them at the run check, put together.

Each node announces its own clients (one per node by default, several where its data set
plug-in returns several): names, training examples, label counts (unless kept private) and
a fingerprint of each one's data. A client's name stands for its data everywhere in the
run (units, the run folder, sampling), so two nodes may announce one name only for the
same data: they are then both its holders, as two nodes started with the same
``--clients`` are. A node that announces a name another node holds with other data is a
`Conflict`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Announcement:
    """One node's clients: name -> examples, label counts (None: private), fingerprint."""

    node: str
    sizes: dict[str, int]
    labels: dict[str, dict[int, int] | None] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Conflict:
    """Node ``other`` announces ``client``, which node ``first`` holds with other data."""

    client: str
    first: str
    other: str
    detail: str

    def __str__(self) -> str:
        return (f"client {self.client!r} is announced by nodes {self.first} and "
                f"{self.other} with different data ({self.detail}): node-resident "
                f"client names must be unique across nodes (one name on two nodes is "
                f"one client's data, held twice)")


@dataclass
class Clients:
    """The run's node-resident clients: examples and label counts by name."""

    sizes: dict[str, int] = field(default_factory=dict)
    labels: dict[str, dict[int, int] | None] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    _holder: dict[str, tuple[str, str]] = field(default_factory=dict)  # node, fingerprint

    def take(self, announcement: Announcement) -> Conflict | None:
        """Add a node's clients; a conflict (and none of its clients taken) when one of
        them is another node's client of the same name with other data."""
        for name, size in announcement.sizes.items():
            conflict = self._conflict(announcement, name, size)
            if conflict is not None:
                self.conflicts.append(conflict)
                return conflict
        for name, size in announcement.sizes.items():
            self._holder.setdefault(name, (announcement.node,
                                           announcement.fingerprints.get(name, "")))
            self.sizes[name] = size
            if self.labels.get(name) is None:  # a replica may show what another keeps
                self.labels[name] = announcement.labels.get(name)
        return None

    def fingerprints(self) -> dict[str, str]:
        """Each client's data fingerprint, as its first holder announced it."""
        return {name: fingerprint for name, (_, fingerprint) in self._holder.items()}

    def _conflict(self, announcement: Announcement, name: str, size: int) -> Conflict | None:
        if name not in self._holder:
            return None
        node, fingerprint = self._holder[name]
        if self.sizes[name] != size:
            return Conflict(name, node, announcement.node,
                            f"{self.sizes[name]} and {size} examples")
        other = announcement.fingerprints.get(name, "")
        if fingerprint != other:
            return Conflict(name, node, announcement.node,
                            f"data fingerprints {fingerprint or 'none'} and {other or 'none'}")
        return None


def put_together(announcements: Iterable[Announcement]) -> Clients:
    """The clients of the nodes' announcements, in order: a name is its first holder's
    data; a node that announces it with other data is a conflict."""
    clients = Clients()
    for announcement in announcements:
        clients.take(announcement)
    return clients
