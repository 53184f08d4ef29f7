"""Aggregation rules: how a round's updates become the one update the algorithm applies.

Each rule is a pure function of the round's updates (name -> array, one dict per result)
and their sample counts, in unit order (`AveragingAlgorithm.combine` in
training/algorithms/base.py applies the configured one to a round's results). `mean` is
the sample-weighted average, summed unit by unit in float64 as runs always have (written
out as float32 for an algorithm that takes float32 anyway: the same bits). Robust
rules bound what a few Byzantine nodes can do to the model:

- `median`: the coordinate-wise median (unweighted: a weight would let a node that
  claims many samples move it).
- `trimmed_mean`: per coordinate, drop the `trim_fraction` smallest and largest values,
  then the sample-weighted mean of the rest.
- `krum` (multi-Krum): score each update by the summed squared distances to its
  n - f - 2 nearest others (f = `byzantine`), keep the `krum_keep` lowest scores and
  take their sample-weighted mean.

A new rule is a function ``rule(updates, samples)`` (or ``rule(updates, samples,
settings)``, to read the section's keys) returning the combined update: registered by name
with `register_aggregation` (e.g. by an installed plug-in package), or named as a plug-in
(``aggregation.rule: my_rules:geometric_median``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from thrift_trainer.training import plugins
from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.schema import AggregationSettings, defaults

Weights = dict[str, np.ndarray]
SECTION = "aggregation"  # the key of the rule's settings in an algorithm's config


BLOCK_ELEMENTS = 1 << 20  # elements combined at a time: 8 MiB of float64 per update
# The mean of one update of these dtypes is the update itself: x * n is exact in float64
# (a significand of 24 or 11 bits times n < 2**29), so (0 + x * n) / n is x, but for
# -0.0, which the sum's 0 + makes +0.0, as x + 0.0 does.
_EXACT_ALONE = (np.dtype(np.float32), np.dtype(np.float16))
_EXACT_SAMPLES = 1 << 29


class AggregationError(ValueError):
    """Settings no rule can use; the message names the key (aggregation.<key>)."""


# ------------------------------------------------------------------------ the rules
def weighted_mean(updates: Sequence[Mapping[str, np.ndarray]], samples: Sequence[int],
                  narrow: bool = False) -> Weights:
    """The sample-weighted mean of every update, computed in float64 a block of elements
    at a time, each element by the same operations in the same order as a whole-array
    sum would: the same numbers, without float64 copies of every update of a big model.
    The mean is float64, or with ``narrow`` float32 for the names whose updates are all
    float32: each block's float64 mean rounded as it is written, so the bits are those of
    the float64 mean cast afterwards, and a big model's mean takes half the memory."""
    mean = {}
    for name in updates[0]:
        parts = flat_parts(updates, name)
        single = narrow and all(part.dtype == np.float32 for part in parts)
        out = np.empty(parts[0].size, dtype=np.float32 if single else np.float64)
        if len(parts) == 1 and _alone_exact(parts[0], samples[0]):
            np.add(parts[0], out.dtype.type(0.0), out=out, dtype=out.dtype)  # one pass
        else:
            for start in range(0, out.size, BLOCK_ELEMENTS):
                block = slice(start, start + BLOCK_ELEMENTS)
                out[block] = mean_of_block(parts, samples, block)
        mean[name] = out.reshape(np.shape(updates[0][name]))
    return mean


def _alone_exact(part: np.ndarray, samples: int) -> bool:
    """Whether the mean of ``part`` alone, weighted by ``samples``, is ``part + 0.0``:
    the same bits as `mean_of_block` makes of it, without its three passes (a round of
    one node, each round)."""
    return part.dtype in _EXACT_ALONE and 0 < samples < _EXACT_SAMPLES


def flat_parts(updates: Sequence[Mapping[str, np.ndarray]], name: str) -> list[np.ndarray]:
    """Every update's tensor ``name``, flat (views)."""
    return [np.asarray(u[name]).reshape(-1) for u in updates]


def mean_of_block(parts: Sequence[np.ndarray], samples: Sequence[int],
                  block: slice) -> np.ndarray:
    """The float64 sample-weighted mean of elements ``block`` of the flat ``parts``: what
    `weighted_mean` computes of each block, so that a caller taking the mean a block at a
    time (training/optimizer_blocks.py) gets its very bits."""
    total = float(sum(samples))
    return sum(part[block].astype(np.float64) * n
               for part, n in zip(parts, samples, strict=True)) / total


def coordinate_median(updates: Sequence[Mapping[str, np.ndarray]],
                      samples: Sequence[int]) -> Weights:
    """The median of each coordinate over the updates (sample counts are not used)."""
    n = len(updates)
    middle = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
    # A partial sort around the middle: about half the cost of np.median here.
    return {name: np.partition(_stacked(updates, name), middle, axis=0)[middle].mean(axis=0)
            for name in updates[0]}


def trimmed_mean(updates: Sequence[Mapping[str, np.ndarray]], samples: Sequence[int],
                 trim_fraction: float) -> Weights:
    """Per coordinate: drop the floor(trim_fraction * n) smallest and largest values and
    take the sample-weighted mean of the others."""
    n = len(updates)
    cut = math.floor(trim_fraction * n)
    weights = np.asarray(samples, dtype=np.float64)
    equal = bool(np.all(weights == weights[0]))
    result = {}
    for name in updates[0]:
        stacked = _stacked(updates, name)
        if equal:  # the same weight everywhere: sorting the values alone is enough (faster)
            result[name] = np.sort(stacked, axis=0)[cut:n - cut].mean(axis=0)
            continue
        order = np.argsort(stacked, axis=0, kind="stable")[cut:n - cut]
        kept = np.take_along_axis(stacked, order, axis=0)
        kept_weights = weights[order]  # each kept value keeps its own update's weight
        result[name] = (kept * kept_weights).sum(axis=0) / kept_weights.sum(axis=0)
    return result


def krum_scores(updates: Sequence[Mapping[str, np.ndarray]], byzantine: int) -> np.ndarray:
    """Each update's Krum score: the sum of squared distances to its n - f - 2 nearest
    other updates (at least one, at most n - 1, for rounds smaller than planned)."""
    n = len(updates)
    flat = np.stack([np.concatenate([np.asarray(u[name], dtype=np.float64).ravel()
                                     for name in updates[0]]) for u in updates])
    squared = (flat ** 2).sum(axis=1)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2.0 * flat @ flat.T, 0.0)
    neighbours = min(max(n - byzantine - 2, 1), n - 1)
    scores = np.zeros(n)
    for i in range(n):
        others = np.delete(distances[i], i)
        scores[i] = np.sort(others)[:neighbours].sum()
    return scores


def multi_krum(updates: Sequence[Mapping[str, np.ndarray]], samples: Sequence[int],
               byzantine: int, keep: int) -> Weights:
    """The sample-weighted mean of the `keep` updates with the lowest Krum scores."""
    if len(updates) == 1:
        return weighted_mean(updates, samples)
    chosen = np.argsort(krum_scores(updates, byzantine), kind="stable")[:min(keep, len(updates))]
    return weighted_mean([updates[i] for i in chosen], [samples[i] for i in chosen])


Rule = Callable[[Sequence[Mapping[str, np.ndarray]], Sequence[int]], Weights]
RULES: dict[str, Callable[[Mapping[str, Any]], Rule]] = {
    "mean": lambda s: weighted_mean,
    "median": lambda s: coordinate_median,
    "trimmed_mean": lambda s: lambda u, n: trimmed_mean(u, n, s["trim_fraction"]),
    "krum": lambda s: lambda u, n: multi_krum(u, n, s["byzantine"], s["krum_keep"]),
}


def register_aggregation(name: str, rule: Callable[..., Weights]) -> None:
    """Make ``rule`` (updates, samples[, settings]) -> update usable as ``aggregation.rule:
    name``."""
    if not name or ":" in name:
        raise ValueError(f"an aggregation rule's name must be plain, got {name!r}")
    RULES[name] = _settings_rule(rule)


def _settings_rule(rule: Callable[..., Weights]) -> Callable[[Mapping[str, Any]], Rule]:
    """A rule taking (updates, samples[, settings]) as RULES holds them."""
    try:
        takes_settings = len(inspect.signature(rule).parameters) >= 3
    except (TypeError, ValueError):
        takes_settings = False
    if takes_settings:
        return lambda s: lambda u, n: rule(u, n, s)
    return lambda s: rule


def rule_of(name: str) -> Callable[[Mapping[str, Any]], Rule]:
    """The rule of a registered name or of a plug-in ``module:function``."""
    if name in RULES:
        return RULES[name]
    if plugins.is_plugin_name(name):
        found = plugins.resolve(name, "aggregation rule")
        if not callable(found):
            raise plugins.PluginError(f"aggregation rule {name} is not a function")
        return _settings_rule(found)
    raise AggregationError(f"config key '{SECTION}.rule' must be one of {', '.join(RULES)} or a "
                           f"plug-in module:function, got {name!r}")


def aggregate(settings: Mapping[str, Any], updates: Sequence[Mapping[str, np.ndarray]],
              samples: Sequence[int], narrow: bool = False) -> Weights:
    """The round's update by the rule `settings["rule"]` (settings as `check_settings`
    returns them). ``narrow``: the caller takes float32 anyway, so the mean of float32
    updates may be float32 (`weighted_mean`); the other rules return what they return."""
    if not updates:
        raise ValueError("no update was added to the aggregate")
    rule = rule_of(settings["rule"])(settings)
    if narrow and rule is weighted_mean:
        return weighted_mean(updates, samples, narrow=True)
    return rule(updates, samples)


def _stacked(updates: Sequence[Mapping[str, np.ndarray]], name: str) -> np.ndarray:
    return np.stack([np.asarray(u[name], dtype=np.float64) for u in updates])


# ----------------------------------------------------------------------- settings
def check_settings(given: Any) -> dict[str, Any]:
    """The `aggregation` settings with defaults filled in; AggregationError naming the key
    for an unknown key, a value of the wrong type or out of range."""
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise AggregationError(f"config key {SECTION!r} must be a mapping, got {given!r}")
    known = defaults(AggregationSettings)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise AggregationError(f"unknown config key '{SECTION}.{unknown[0]}'; "
                               f"known: {', '.join(known)}")
    settings = {key: _typed(key, given.get(key, default), default)
                for key, default in known.items()}
    try:
        rule_of(settings["rule"])
    except plugins.PluginError as exc:
        raise AggregationError(f"config key '{SECTION}.rule': {exc}") from None
    if not 0.0 <= settings["trim_fraction"] < 0.5:
        raise AggregationError(f"config key '{SECTION}.trim_fraction' must be in [0, 0.5), "
                               f"got {settings['trim_fraction']}")
    if settings["byzantine"] < 0:
        raise AggregationError(f"config key '{SECTION}.byzantine' must be at least 0, "
                               f"got {settings['byzantine']}")
    if settings["krum_keep"] < 1:
        raise AggregationError(f"config key '{SECTION}.krum_keep' must be at least 1, "
                               f"got {settings['krum_keep']}")
    return settings


def check_round_size(settings: Mapping[str, Any], updates_per_round: int) -> None:
    """AggregationError if the rule cannot work on rounds of `updates_per_round` updates:
    multi-Krum keeps at most n - 2f - 2 of n updates."""
    if settings["rule"] != "krum":
        return
    most = updates_per_round - 2 * settings["byzantine"] - 2
    if settings["krum_keep"] > most:
        raise AggregationError(
            f"config key '{SECTION}.krum_keep' is {settings['krum_keep']}, but a round of "
            f"{updates_per_round} updates with '{SECTION}.byzantine' "
            f"{settings['byzantine']} allows at most n - 2f - 2 = {most}")


def _typed(key: str, value: Any, default: Any) -> Any:
    value = checked_value(f"config key '{SECTION}.{key}'", value, default, AggregationError)
    if isinstance(value, float) and not math.isfinite(value):
        raise AggregationError(f"config key '{SECTION}.{key}' must be finite, got {value}")
    return value
