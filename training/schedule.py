"""When results become new weights: synchronous rounds, or asynchronous updates.

Settings come from the run configuration's ``schedule`` section:

* ``mode``: ``sync`` (rounds with a barrier: a round waits for its K results; the default),
  ``async`` (every result is applied as it arrives: one global-model version per result)
  or ``buffered`` (results collect in a buffer of ``buffer_size``; a full buffer is
  combined by the run's aggregation rule and applied as one version, as in FedBuff);
* ``buffer_size``: results per version in ``buffered`` mode (default 3; ``async`` is 1);
* ``max_staleness``: a result computed from weights more than this many versions old is
  recorded as stale and its unit issued again with the current weights (default 8);
* ``staleness_weighting``: ``none`` or ``polynomial``: a result of staleness s is scaled
  by (1 + s) ** -``staleness_exponent`` (default 0.5), as in FedAsync;
* ``updates_per_round``: versions that make a "round" in the asynchronous modes, so that
  rounds, evaluation, checkpoints and ``--rounds`` keep their meaning; 0 (the default)
  makes a round take as many results as a synchronous round has units (rounded up to
  whole buffers): the number of units in ``async`` mode;
* ``prefetch``: units sent ahead to a node while it computes (default 0: one unit out per
  node). With 1, a node holds its next unit, weights decoded, when it finishes one, so
  the round trip and the coordinator's update leave the node's critical path; each
  unit sent ahead is one version staler. Asynchronous modes only: a sync round's next
  weights do not exist until its results are in.

Like ``compression``, the section travels inside a request's config only when it is not
the default (a sync request is exactly what it was before), and the coordinator takes it
out before the algorithm sees the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError, section_mapping
from thrift_trainer.training.units import UnitResult

SECTION = "schedule"
MODES = ("sync", "async", "buffered")
WEIGHTINGS = ("none", "polynomial")
KEYS = ("mode", "buffer_size", "max_staleness", "staleness_weighting", "staleness_exponent",
        "updates_per_round", "prefetch")
MAX_BUFFER = 10_000
MAX_STALENESS = 1_000_000
MAX_PREFETCH = 8


@dataclass(frozen=True)
class ScheduleSettings:
    mode: str = "sync"
    buffer_size: int = 3
    max_staleness: int = 8
    staleness_weighting: str = "none"
    staleness_exponent: float = 0.5
    updates_per_round: int = 0
    prefetch: int = 0

    @property
    def asynchronous(self) -> bool:
        return self.mode != "sync"

    @property
    def results_per_version(self) -> int:
        """Results combined into one version: 1 in ``async`` mode."""
        return self.buffer_size if self.mode == "buffered" else 1

    @property
    def units_per_node(self) -> int:
        """Units a node may hold at once: the one it computes and those sent ahead."""
        return 1 + self.prefetch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def weight(self, staleness: int) -> float:
        """The factor a result of ``staleness`` versions is scaled by."""
        if self.staleness_weighting == "polynomial":
            return (1.0 + staleness) ** -self.staleness_exponent
        return 1.0


SYNC = ScheduleSettings()


def split_schedule(config: Mapping[str, Any]) -> tuple[dict[str, Any], ScheduleSettings]:
    """A request's config without its ``schedule`` key, and the checked settings."""
    rest = {key: value for key, value in config.items() if key != SECTION}
    return rest, settings_from(config.get(SECTION))


def join_schedule(config: Mapping[str, Any], settings: ScheduleSettings) -> dict[str, Any]:
    """A train request's config: with the section unless it is plain sync, so a sync run
    sends what it sent before schedules existed (prefetch travels even in sync mode, for
    the coordinator to refuse rather than ignore)."""
    if settings.asynchronous or settings.prefetch:
        return {**config, SECTION: settings.to_dict()}
    return dict(config)


def settings_from(raw: Any) -> ScheduleSettings:
    """Checked settings from a ``schedule`` mapping; ConfigError names the bad key."""
    if raw is None:
        return SYNC
    raw = section_mapping(SECTION, raw, KEYS)
    values = {**SYNC.to_dict(), **raw}
    _check_choice("mode", values["mode"], MODES)
    _check_choice("staleness_weighting", values["staleness_weighting"], WEIGHTINGS)
    _check_int("buffer_size", values["buffer_size"], 1, MAX_BUFFER)
    _check_int("max_staleness", values["max_staleness"], 0, MAX_STALENESS)
    _check_int("updates_per_round", values["updates_per_round"], 0, MAX_BUFFER)
    _check_int("prefetch", values["prefetch"], 0, MAX_PREFETCH)
    if values["prefetch"] and values["mode"] == "sync":
        raise ConfigError(f"{SECTION}.prefetch is for the async and buffered modes: a sync "
                          "round's next weights do not exist until its results are in "
                          f"(set {SECTION}.mode, or prefetch 0)")
    exponent = values["staleness_exponent"]
    if (isinstance(exponent, bool) or not isinstance(exponent, int | float)
            or not math.isfinite(exponent) or not 0 <= exponent <= 100):
        raise ConfigError(f"{SECTION}.staleness_exponent must be a number in [0, 100], "
                          f"got {exponent!r}")
    return ScheduleSettings(**{**values, "staleness_exponent": float(exponent)})


def check_usable(settings: ScheduleSettings, algorithm: type[Algorithm],
                 deterministic: bool) -> None:
    """ConfigError unless the run can use the mode: asynchronous modes are for algorithms
    whose updates can be applied one by one (`Algorithm.asynchronous`: the others keep
    state on nodes, as md_gan's discriminators, or average whole models, as fl_gan), and
    never deterministic (arrival order decides what each update is computed from)."""
    if not settings.asynchronous:
        return
    if not algorithm.asynchronous:
        raise ConfigError(f"{SECTION}.mode: {algorithm.name} cannot train in "
                          f"{settings.mode!r} mode (it can: sync)")
    if deterministic:
        raise ConfigError(f"{SECTION}.mode: {settings.mode!r} cannot be deterministic (the "
                          "order results arrive in decides what each is computed from); "
                          "use mode sync with --deterministic")


def staleness_warning(settings: ScheduleSettings, nodes: int) -> str | None:
    """Why ``max_staleness`` will have most results computed again, or None. With
    ``units_per_node`` units out per node, a result comes back about
    (nodes x units_per_node - 1) / buffer_size versions after its weights were sent."""
    typical = (nodes * settings.units_per_node - 1) // settings.results_per_version
    if not settings.asynchronous or typical <= settings.max_staleness:
        return None
    return (f"with {nodes} nodes, results are usually about {typical} versions old, more "
            f"than {SECTION}.max_staleness {settings.max_staleness}: most will be computed "
            "again (raise max_staleness, or use a larger buffer_size)")


def weighted(results: list[UnitResult], factors: list[float],
             scalable: Callable[[str], bool]) -> list[UnitResult]:
    """``results`` with each update's ``scalable`` tensors (deltas and gradients, not
    states such as BatchNorm statistics) scaled by its staleness factor. A factor of 1
    leaves the result as it is, so an unweighted buffer is combined bit for bit like a
    round's results."""
    return [result if factor == 1.0 else UnitResult(
        result.unit, {name: np.asarray(value * factor, dtype=value.dtype)
                      if scalable(name) else value for name, value in result.update.items()},
        result.num_samples, result.loss, result.node)
        for result, factor in zip(results, factors, strict=True)]


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{SECTION}.{key} must be one of {', '.join(choices)}, got {value!r}")


def _check_int(key: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{SECTION}.{key} must be an integer in {low}..{high}, got {value!r}")
