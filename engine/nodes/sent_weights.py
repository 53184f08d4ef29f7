"""Which weights one node was sent, so that later units may refer to them instead.

A node keeps the weights of the last versions of a run it was sent
(compute_node/weight_cache.py). A task may then go out with ``weights_cached`` and no
weights when this node already got *exactly these tensors* for the task's run and model
version: the very dict object (every unit of a sync round shares one dict, already
encoded with the run's 'down' codec), not merely the same version number. So a unit that
carries its own tensors (MD-GAN's batches: a new dict per unit) is never sent as a
reference, and if two different dicts ever went to the node under one (run, version),
that version is never referred to again, whichever arrived last. A task without weights
(a secure round's key, share and unmask steps, each a fresh empty dict under the round's
version) counts for nothing here: the node answers it before its weight cache is touched
(compute_node/handler.py), so the round's weights stay referable.

A reference is only made once the node has completed a unit sent with these weights: it
keeps them once a unit's maths took them, before it answers, so the reference will find
them unless the node restarted or dropped them since, and then it answers NEED_WEIGHTS and
the client sends the task again with its weights. Units sent at once, before any answer,
all carry the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from thrift_trainer.engine import runtime
from thrift_trainer.engine.tasks import Task

VERSIONS_PER_RUN = 2  # as many as a node keeps (compute_node/weight_cache.py)
MAX_RUNS = 4


@dataclass
class _Sent:
    weights: Mapping | None  # the dict sent (kept alive, so its id is never reused); None:
    # two different dicts went out under this version, so it is never referred to
    held: bool = False  # the node completed a unit that carried them


class SentWeights:
    """Per node: the weights dicts sent by (run id, model version)."""

    def __init__(self, versions_per_run: int = VERSIONS_PER_RUN,
                 max_runs: int = MAX_RUNS) -> None:
        self.versions_per_run = versions_per_run
        self.max_runs = max_runs
        self._runs: dict[str, dict[int, _Sent]] = {}
        self._lock = runtime.Lock()

    def refers(self, task: Task) -> bool:
        """Whether ``task`` may go without its weights: the node holds these very ones."""
        if not task.weights:
            return False
        with self._lock:
            sent = self._runs.get(task.run_id, {}).get(task.version)
            return sent is not None and sent.held and sent.weights is task.weights

    def sending(self, task: Task) -> None:
        """``task`` goes out with its weights (call before sending). A task that carries
        none (a secure round's key, share and unmask steps) sends nothing and leaves what
        the node holds as it was."""
        if not task.weights:
            return
        with self._lock:
            versions = self._runs.pop(task.run_id, {})
            self._runs[task.run_id] = versions  # the run used last goes last
            sent = versions.get(task.version)
            if sent is None:
                versions[task.version] = _Sent(task.weights)
            elif sent.weights is not task.weights:
                sent.weights, sent.held = None, False
            for version in sorted(versions)[:-self.versions_per_run]:
                del versions[version]
            while len(self._runs) > self.max_runs:
                del self._runs[next(iter(self._runs))]

    def completed(self, task: Task) -> None:
        """The node completed ``task``, sent with its weights: it has kept them."""
        with self._lock:
            sent = self._runs.get(task.run_id, {}).get(task.version)
            if sent is not None and sent.weights is task.weights:
                sent.held = True

    def lost(self, task: Task) -> None:
        """The node did not hold them after all (restarted, or dropped them)."""
        with self._lock:
            sent = self._runs.get(task.run_id, {}).get(task.version)
            if sent is not None:
                sent.held = False

    def forget_run(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
