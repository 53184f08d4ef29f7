"""The coordinator's records (coordinator.records) and the Thrift structs of its service,
both ways: the service handler's translation, and the run's errors as the IDL's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from thrift_trainer.coordinator.records import (
    InvalidRun,
    RunFailed,
    RunOutcome,
    RunRequest,
    RunStopped,
)
from thrift_trainer.engine.nodes.thrift_client import node_summary
from thrift_trainer.engine.records import RoundMetrics, RunSnapshot, fields_of
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire


def round_metrics(metrics: RoundMetrics) -> ttypes.RoundMetrics:
    return ttypes.RoundMetrics(**fields_of(metrics))


def run_status(snapshot: RunSnapshot) -> ttypes.RunStatus:
    fields = {**fields_of(snapshot), "nodes": [node_summary(n) for n in snapshot.nodes],
              "recent_rounds": [round_metrics(m) for m in snapshot.recent_rounds]
              if snapshot.recent_rounds else None}
    return ttypes.RunStatus(**fields)


def run_request(request: ttypes.TrainRequest) -> RunRequest:
    return RunRequest(run_id=request.run_id, algorithm=request.algorithm, model=request.model,
                      dataset=request.dataset, rounds=request.rounds,
                      config_json=request.config_json, outputs_json=request.outputs_json)


def run_result(outcome: RunOutcome) -> ttypes.RunResult:
    return ttypes.RunResult(
        run_id=outcome.run_id, validation_error=outcome.validation_error,
        rounds=outcome.rounds, wall_seconds=outcome.wall_seconds,
        history=[round_metrics(m) for m in outcome.history],
        nodes=[node_summary(n) for n in outcome.nodes], weights=dict_to_wire(outcome.weights),
        model_json=outcome.model_json, run_dir=outcome.run_dir, bytes_up=outcome.bytes_up,
        bytes_down=outcome.bytes_down, aggregation=outcome.aggregation,
        compression_json=outcome.compression_json)


@contextlib.contextmanager
def service_errors() -> Iterator[None]:
    """Raise a run's errors inside as the IDL's exceptions, for the client."""
    try:
        yield
    except InvalidRun as exc:
        raise ttypes.InvalidRequest(message=str(exc)) from None
    except RunFailed as exc:
        raise ttypes.TrainingFailed(message=str(exc), nodes_tried=exc.nodes_tried) from None
    except RunStopped as exc:
        raise ttypes.RunCancelled(message=str(exc)) from None
