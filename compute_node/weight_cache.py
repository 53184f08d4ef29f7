"""Weights a node kept from earlier units, so that a coordinator may refer to them.

A work request normally carries the model's weights (1.1 MB for DCGAN-28). When a node
gets several units of one model version (more units than nodes in a round, a retry, a
backup), sending them again is wasted time on the round's critical path: the coordinator
sets ``weights_cached`` instead and leaves the weights out, and the node takes the ones
it kept here. A node that does not hold them answers NEED_WEIGHTS and the coordinator
sends the task again with its weights.

Entries are keyed by (run id, model version, down codec): the codec is part of the key
because the arrays kept are those decoded from what was sent, and a run's weights could
reach a node under another codec only through a bug, which must not turn into silently
wrong weights. The node keeps only weights a unit's maths accepted (compute_node/handler.py:
weights that do not fit the model are never kept). Memory is bounded: the newest
``versions_per_run`` versions of each run (older ones are dropped as newer ones arrive), the
``max_runs`` runs used last, and ``max_bytes`` in all (the oldest versions of the runs used
least recently go first; weights larger than that are not kept); a run's entries also go
when the coordinator drops the run's sessions. Kept arrays are read-only: the received
arrays themselves (views of their message, which nothing writes), copies of any others; a
unit that may change its weights in place (`Algorithm.writes_weights`) gets its own
copies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

Tensors = dict[str, np.ndarray]

DEFAULT_VERSIONS_PER_RUN = 2  # the newest version and the one before (backups, stragglers)
DEFAULT_MAX_RUNS = 4
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

Key = tuple[int, str]  # (model version, down codec)


class WeightCache:
    """The newest weights of the runs a node served, by (run id, version, codec)."""

    def __init__(self, versions_per_run: int = DEFAULT_VERSIONS_PER_RUN,
                 max_runs: int = DEFAULT_MAX_RUNS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if versions_per_run < 1 or max_runs < 1 or max_bytes < 1:
            raise ValueError("versions_per_run, max_runs and max_bytes must be at least 1")
        self.versions_per_run = versions_per_run
        self.max_runs = max_runs
        self.max_bytes = max_bytes
        # run id -> {(version, codec): arrays}; runs in the order they were last used
        self._runs: OrderedDict[str, dict[Key, Tensors]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, run_id: str, version: int, codec: str, weights: Tensors) -> bool:
        """Keep ``weights`` read-only (`_read_only`) unless the run already holds
        ``versions_per_run`` newer versions or they exceed ``max_bytes``; returns whether
        they were kept."""
        if _nbytes(weights) > self.max_bytes:
            return False
        kept = {name: _read_only(value) for name, value in weights.items()}
        with self._lock:
            self._remove(run_id, (version, codec))  # a version sent again replaces it
            entries = self._runs.setdefault(run_id, {})
            self._runs.move_to_end(run_id)
            entries[(version, codec)] = kept
            self._bytes += _nbytes(kept)
            for key in sorted(entries, key=lambda k: k[0])[:-self.versions_per_run]:
                self._remove(run_id, key)
            while len(self._runs) > self.max_runs:
                self._drop(next(iter(self._runs)))
            self._shrink(keep=(run_id, (version, codec)))
            return (version, codec) in self._runs.get(run_id, {})

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays kept."""
        with self._lock:
            return self._bytes

    def _shrink(self, keep: tuple[str, Key]) -> None:
        """Drop entries until ``max_bytes`` holds them: the oldest versions of the runs used
        least recently first, never ``keep`` (which fits alone)."""
        for run_id in list(self._runs):
            for key in sorted(self._runs[run_id], key=lambda k: k[0]):
                if self._bytes <= self.max_bytes:
                    return
                if (run_id, key) != keep:
                    self._remove(run_id, key)

    def _remove(self, run_id: str, key: Key) -> None:
        entries = self._runs.get(run_id, {})
        if key in entries:
            self._bytes -= _nbytes(entries.pop(key))
        if not entries:
            self._runs.pop(run_id, None)

    def _drop(self, run_id: str) -> int:
        entries = self._runs.pop(run_id, {})
        self._bytes -= sum(_nbytes(kept) for kept in entries.values())
        return len(entries)

    def get(self, run_id: str, version: int, codec: str,
            writable: bool = True) -> Tensors | None:
        """The kept weights, as writable copies or (not `writable`) the read-only arrays
        themselves; None when they are not held."""
        with self._lock:
            kept = self._runs.get(run_id, {}).get((version, codec))
            if kept is None:
                return None
            self._runs.move_to_end(run_id)
        if not writable:
            return dict(kept)
        return {name: value.copy() for name, value in kept.items()}

    def drop_run(self, run_id: str) -> int:
        """Forget the run's weights; returns how many versions were kept."""
        with self._lock:
            return self._drop(run_id)

    def versions(self, run_id: str) -> list[int]:
        """The versions kept for the run, oldest first (for tests and logs)."""
        with self._lock:
            return sorted({version for version, _ in self._runs.get(run_id, {})})

    def runs(self) -> list[str]:
        """The runs with kept weights, least recently used first."""
        with self._lock:
            return list(self._runs)


def _nbytes(weights: Tensors) -> int:
    return sum(np.asarray(value).nbytes for value in weights.values())


def _read_only(value: np.ndarray) -> np.ndarray:
    """The array itself when it is read-only already (a view of a received message, which
    nothing writes: a big model is not held twice), else a read-only copy."""
    if not value.flags.writeable and value.flags.c_contiguous:
        return value
    copy = np.array(value, copy=True, order="C")
    copy.flags.writeable = False
    return copy
