"""The tasks a run sends its nodes: one unit's work, with the weights it starts from."""

from __future__ import annotations

from collections.abc import Callable

from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.engine import runtime
from thrift_trainer.engine.tasks import Task, Tensors
from thrift_trainer.training.units import TensorSpecs, UnitSpec, Weights


class RunTasks:
    """Builds a run's tasks; the same run fields in each, the unit's and weights apart."""

    def __init__(self, run_id: str, request: RunRequest, config_json: str,
                 policy: int) -> None:
        self.run_id = run_id
        self.request = request
        self.config_json = config_json
        self.policy = policy
        # what results must hold, sent with each unit so that relays check their members':
        # known once training starts
        self.expected_update: TensorSpecs | None = None

    def task(self, round_index: int, unit: UnitSpec, attempt: int, weights: Tensors,
             model_version: int | None = None) -> Task:
        request = self.request
        return Task(
            run_id=self.run_id, round=round_index,
            unit_id=unit.unit_id, attempt=attempt, algorithm=request.algorithm,
            model=request.model, dataset=request.dataset, unit_path=unit.unit_path,
            config_json=self.config_json, weights=weights,
            scheduling_policy=self.policy, index_start=unit.index_start,
            index_stop=unit.index_stop, model_version=model_version,
            expected_update=self.expected_update, client=unit.client, kind=unit.kind)


class VersionCache:
    """The weights of the newest version as sent (compressed once per version, not once per
    task): asynchronous modes make a new version per result, and tasks in between share it."""

    def __init__(self, encode: Callable[[Weights], Tensors]) -> None:
        self._encode = encode
        self._lock = runtime.Lock()
        self._version: int | None = None
        self._payload: Tensors = {}

    def get(self, version: int, weights: Weights) -> Tensors:
        with self._lock:
            if version != self._version:
                self._version, self._payload = version, self._encode(weights)
            return self._payload
