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
wrong weights. Memory is bounded: the newest ``versions_per_run`` versions of each run
(older ones are dropped as newer ones arrive) and the ``max_runs`` runs used last; a run's
entries also go when the coordinator drops the run's sessions. Kept arrays are read-only;
a unit gets its own copies (some algorithms change their weights in place).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

Tensors = dict[str, np.ndarray]

DEFAULT_VERSIONS_PER_RUN = 2  # the newest version and the one before (backups, stragglers)
DEFAULT_MAX_RUNS = 4


class WeightCache:
    """The newest weights of the runs a node served, by (run id, version, codec)."""

    def __init__(self, versions_per_run: int = DEFAULT_VERSIONS_PER_RUN,
                 max_runs: int = DEFAULT_MAX_RUNS) -> None:
        if versions_per_run < 1 or max_runs < 1:
            raise ValueError("versions_per_run and max_runs must be at least 1")
        self.versions_per_run = versions_per_run
        self.max_runs = max_runs
        # run id -> {(version, codec): arrays}; runs in the order they were last used
        self._runs: OrderedDict[str, dict[tuple[int, str], Tensors]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, run_id: str, version: int, codec: str, weights: Tensors) -> bool:
        """Keep read-only copies of ``weights`` unless the run already holds
        ``versions_per_run`` newer versions; returns whether they were kept."""
        kept = {name: _read_only_copy(value) for name, value in weights.items()}
        with self._lock:
            entries = self._runs.setdefault(run_id, {})
            self._runs.move_to_end(run_id)
            entries[(version, codec)] = kept
            for key in sorted(entries, key=lambda k: k[0])[:-self.versions_per_run]:
                del entries[key]
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
            return (version, codec) in entries

    def get(self, run_id: str, version: int, codec: str) -> Tensors | None:
        """Writable copies of the kept weights, or None when they are not held."""
        with self._lock:
            kept = self._runs.get(run_id, {}).get((version, codec))
            if kept is None:
                return None
            self._runs.move_to_end(run_id)
        return {name: value.copy() for name, value in kept.items()}

    def drop_run(self, run_id: str) -> int:
        """Forget the run's weights; returns how many versions were kept."""
        with self._lock:
            return len(self._runs.pop(run_id, {}))

    def versions(self, run_id: str) -> list[int]:
        """The versions kept for the run, oldest first (for tests and logs)."""
        with self._lock:
            return sorted({version for version, _ in self._runs.get(run_id, {})})

    def runs(self) -> list[str]:
        """The runs with kept weights, least recently used first."""
        with self._lock:
            return list(self._runs)


def _read_only_copy(value: np.ndarray) -> np.ndarray:
    copy = np.array(value, copy=True, order="C")
    copy.flags.writeable = False
    return copy
