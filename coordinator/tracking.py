"""Experiment tracking: every run's figures in TensorBoard event files and MLflow runs, as
the coordinator writes its run folder (`coordinator_node.py --track KIND:WHERE`).

- `tensorboard:DIR` writes `DIR/<run id>/` event files: every figure of each
  `metrics.jsonl` row as a scalar at its round (its phases under `phase_seconds/`), and the
  run's description (algorithm, model, data, settings) as text.
- `mlflow:URI` logs to an MLflow tracking store (`sqlite:///mlflow.db` for a local one, no
  server; or a server's `http://...`): one MLflow run per run, named by its id and tagged
  `thrift_trainer.run_id` (a resumed run goes on in the same MLflow run), its settings as
  parameters, each round's figures as metrics at their round, and at the end the model
  (`model.safetensors`), `curves.png`, `metrics.jsonl` and, with clients, `partition.png`
  as artifacts; the MLflow run ends FINISHED, FAILED or KILLED (cancelled) as the run does.

Both need the `tracking` extra (`pip install 'thrift-trainer[tracking]'`); the coordinator
refuses a `--track` whose package is missing when it starts. A tracker never fails a run: the
first error of a tracker is logged with its reason and that tracker stops for the run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("coordinator.tracking")

KINDS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # kind -> the module it needs
EXTRA = "pip install 'thrift-trainer[tracking]'"
EXPERIMENT = "thrift-trainer"
RUN_TAG = "thrift_trainer.run_id"
PARAM_CHARS = 500  # MLflow keeps parameter values this long at least in every store
STATES = {"completed": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


class Tracker(Protocol):
    """Where a run's figures go besides its folder."""

    def start(self, run_id: str, description: Mapping[str, Any]) -> None: ...

    def log_round(self, round_index: int, figures: Mapping[str, float]) -> None: ...

    def finish(self, state: str, files: Iterable[Path]) -> None: ...


def check_target(text: str) -> str:
    """A `--track` value as given, once it names a known kind whose package is installed;
    ValueError, in one line that says what to do, otherwise."""
    kind, sep, where = text.partition(":")
    if not sep or not where or kind not in KINDS:
        raise ValueError(f"--track {text!r}: expected tensorboard:DIR or mlflow:URI")
    if importlib.util.find_spec(KINDS[kind]) is None:
        raise ValueError(f"--track {kind} needs the {KINDS[kind]} package: {EXTRA}")
    return text


# What each kind imports to write (its first import takes seconds and, in a run's thread,
# would hold the interpreter from answering status calls meanwhile).
LIBRARIES = {"tensorboard": ("torch.utils.tensorboard",),
             "mlflow": ("mlflow.tracking", "mlflow.entities")}


def load_libraries(targets: Iterable[str]) -> None:
    """Import what the trackers of ``targets`` write with, once, before any run starts."""
    for target in targets:
        for module in LIBRARIES[target.partition(":")[0]]:
            importlib.import_module(module)


def make_tracker(target: str) -> Tracker:
    kind, _, where = target.partition(":")
    return TensorBoardTracker(Path(where)) if kind == "tensorboard" else MlflowTracker(where)


def figures_of(row: Mapping[str, Any]) -> dict[str, float]:
    """A metrics.jsonl row's measured figures by name (phases as `phase_seconds/<phase>`),
    leaving out the round and what is no number or not finite."""
    figures = {}
    for name, value in row.items():
        if isinstance(value, Mapping):
            figures.update({f"{name}/{k}": v for k, v in figures_of(value).items()})
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and name != "round"):
            figures[name] = float(value)
    return figures


def flat_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as `a.b` keys with their values as text, cut to PARAM_CHARS."""
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[name] = text[:PARAM_CHARS]
    return out


class TensorBoardTracker:
    """Event files under `<root>/<run id>/`, written with torch's SummaryWriter."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._writer: Any = None

    def start(self, run_id: str, description: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(self.root / run_id))
        shown = json.dumps(dict(description), indent=2, default=str)
        self._writer.add_text("run", f"```\n{shown}\n```", 0)

    def log_round(self, round_index: int, figures: Mapping[str, float]) -> None:
        for name, value in figures.items():
            self._writer.add_scalar(name, value, round_index)
        self._writer.flush()  # a round is worth showing at once; rounds are seconds apart

    def finish(self, state: str, files: Iterable[Path]) -> None:
        self._writer.add_text("state", state, 0)
        self._writer.close()


class MlflowTracker:
    """One MLflow run per run, through MLflow's own client."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._client: Any = None
        self._run: str | None = None

    def start(self, run_id: str, description: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.uri)
        experiment = self._client.get_experiment_by_name(EXPERIMENT)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(EXPERIMENT))
        earlier = self._client.search_runs([experiment_id], f"tags.`{RUN_TAG}` = '{run_id}'",
                                           max_results=1)
        if earlier:  # a resumed run goes on in its MLflow run
            self._run = earlier[0].info.run_id
            self._client.update_run(self._run, status="RUNNING")
            return
        self._run = self._client.create_run(experiment_id, run_name=run_id,
                                            tags={RUN_TAG: run_id}).info.run_id
        self._log_params(description)

    def _log_params(self, description: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = flat_params({k: v for k, v in description.items() if k != "config"})
        params.update(flat_params(description.get("config") or {}, "config."))
        items = [Param(k, v) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 in one batch
            self._client.log_batch(self._run, params=items[start:start + 100])

    def log_round(self, round_index: int, figures: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = _now_ms()
        metrics = [Metric(name, value, now, round_index) for name, value in figures.items()]
        self._client.log_batch(self._run, metrics=metrics)

    def finish(self, state: str, files: Iterable[Path]) -> None:
        for path in files:
            if path.is_file():
                self._client.log_artifact(self._run, str(path))
        self._client.set_terminated(self._run, STATES.get(state, "FAILED"))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


class Trackers:
    """A run's trackers, each disabled at its first error (logged): tracking never fails a
    run. Calls after `finish` do nothing, so a run ends its trackers once."""

    def __init__(self, targets: Iterable[str], make: Callable[[str], Tracker] = make_tracker
                 ) -> None:
        self._live: dict[str, Tracker] = {}
        self._pending = list(targets)
        self._make = make
        self._finished = False

    def start(self, run_id: str, description: Mapping[str, Any]) -> None:
        for target in self._pending:
            try:
                tracker = self._make(target)
            except Exception as exc:  # a tracker's trouble is never the run's
                log.warning("tracking to %s stopped for this run: %s", target, exc)
                continue
            self._live[target] = tracker
            self._guard(target, lambda tr=tracker: tr.start(run_id, description))
        self._pending = []

    def log_round(self, round_index: int, row: Mapping[str, Any]) -> None:
        figures = figures_of(row)
        for target, tracker in list(self._live.items()):
            self._guard(target, lambda tr=tracker: tr.log_round(round_index, figures))

    def finish(self, state: str, files: Iterable[Path] = ()) -> None:
        if self._finished:
            return
        self._finished = True
        kept = list(files)
        for target, tracker in list(self._live.items()):
            self._guard(target, lambda tr=tracker: tr.finish(state, kept))

    def _guard(self, target: str, action: Callable[[], Any]) -> None:
        """Do `action`; at its first error, log it and stop tracking to `target`."""
        try:
            action()
        except Exception as exc:  # a tracker's trouble is never the run's
            log.warning("tracking to %s stopped for this run: %s", target, exc)
            self._live.pop(target, None)
