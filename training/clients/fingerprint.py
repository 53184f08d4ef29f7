"""A partition's fingerprint and record, for the run folder.

The fingerprint is a sha256 over the clients' index arrays, each hashed as its length and
its indices in int64 little-endian bytes: the same on every process, platform and numpy
version, so two processes that hold the same partition say so by one string, and a moved
index or a moved boundary between two clients changes it. The record keeps what a reader of
the run folder wants to see of the partition: each client's size and label counts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PREFIX = "sha256:"
_INT64_LE = np.dtype("<i8")


def fingerprint(parts: Sequence[np.ndarray]) -> str:
    """``sha256:<hex>`` of the parts, in client order."""
    digest = hashlib.sha256()
    digest.update(np.asarray([len(parts)], dtype=_INT64_LE).tobytes())
    for part in parts:
        array = np.ascontiguousarray(part, dtype=_INT64_LE)
        # each length first, so that where one client ends and the next begins counts
        digest.update(np.asarray([array.size], dtype=_INT64_LE).tobytes())
        digest.update(array.tobytes())
    return PREFIX + digest.hexdigest()


@dataclass(frozen=True)
class PartitionRecord:
    """What the run folder keeps of a partition: who made it, its fingerprint, and per
    client its size and label counts (label -> examples, labels as strings in JSON)."""

    partitioner: str
    seed: int
    fingerprint: str
    sizes: list[int]
    label_counts: list[dict[int, int]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    # the clients' names, where they are not client0, client1, ... (node-resident clients)
    names: list[str] = field(default_factory=list)
    # each client's validation examples (clients.validation_fraction); empty: none held out
    validation_sizes: list[int] = field(default_factory=list)

    @property
    def clients(self) -> int:
        return len(self.sizes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["label_counts"] = [{str(label): n for label, n in counts.items()}
                                for counts in self.label_counts]
        if not self.validation_sizes:  # a run without validation parts: as before
            del data["validation_sizes"]
        return data

    def to_json(self) -> str:
        """The record as JSON text, keys sorted: equal records give equal text."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PartitionRecord:
        data = json.loads(text)
        data["label_counts"] = [{int(label): int(n) for label, n in counts.items()}
                                for counts in data["label_counts"]]
        return cls(**data)


def record_of(parts: Sequence[np.ndarray], labels: np.ndarray, partitioner: str, seed: int,
              **params: Any) -> PartitionRecord:
    """The record of ``parts`` of the data set whose labels are ``labels``."""
    labels = np.asarray(labels)
    counts = []
    for part in parts:
        kinds, n = np.unique(labels[np.asarray(part, dtype=np.int64)], return_counts=True)
        counts.append({int(label): int(k) for label, k in zip(kinds, n, strict=True)})
    return PartitionRecord(partitioner=partitioner, seed=int(seed),
                           fingerprint=fingerprint(parts),
                           sizes=[int(len(part)) for part in parts],
                           label_counts=counts, params=dict(params))
