"""A plug-in data set of several named clients: one node's data that is several clients.

A data set plug-in returns one map-style data set, or a mapping of client names to
map-style data sets (``{"ward-3": ..., "ward-7": ...}``): the data of several clients a
node holds (`clients.placement: nodes`). The training part is then the clients' data sets
one after the other, in name order, and each client's examples are a range of it (no copy
of any data set is made); a run without node-resident clients reads that training part as
one data set. `check_mapping` refuses a return value of any other shape in one line that
names the plug-in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import ConcatDataset

from thrift_trainer.training.plugins import PluginError

# a client's name: it travels in unit ids (``<name>.d12``, ``eval-<name>``), the run
# folder's files and the dashboard, so it is kept short and plain
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
MAX_CLIENTS_PER_NODE = 10_000


@dataclass(frozen=True)
class ClientParts:
    """One named client's examples: positions in the training and validation parts, and a
    fingerprint of its own data (two nodes that hold a client of one name must hold the
    same data)."""

    train: np.ndarray
    validation: np.ndarray
    fingerprint: str


def is_map_style(data: Any) -> bool:
    return hasattr(data, "__len__") and hasattr(data, "__getitem__")


def check_mapping(name: str, split: str, made: Any) -> dict[str, Any] | None:
    """``made`` (what plug-in ``name`` returned for ``split``) as a checked mapping of
    client names to map-style data sets, in name order; None when it is one data set.
    PluginError says in one line what is wrong."""
    if not isinstance(made, Mapping):
        return None
    what = f"data set {name} returned a mapping for split {split!r}"
    if not made and split != "validation":  # no client's validation data may be fine
        raise PluginError(f"{what} with no client: return at least one name -> data set")
    if len(made) > MAX_CLIENTS_PER_NODE:
        raise PluginError(f"{what} of {len(made)} clients, more than "
                          f"{MAX_CLIENTS_PER_NODE} a node may hold")
    for key, data in made.items():
        if not isinstance(key, str) or NAME.fullmatch(key) is None:
            raise PluginError(f"{what} with a client named {key!r}: names are strings of "
                              f"letters, digits, '_', '.', ':' and '-' (at most 100)")
        if not is_map_style(data) or isinstance(data, Mapping):
            raise PluginError(f"{what} whose client {key!r} is not a map-style data set "
                              f"(it needs __len__ and __getitem__; it gave a "
                              f"{type(data).__name__})")
    return {key: made[key] for key in sorted(made)}


def check_same_clients(name: str, train: dict[str, Any] | None,
                       validation: dict[str, Any] | None) -> None:
    """Both splits one data set, or both mappings, the validation clients among the
    training ones."""
    if (train is None) != (validation is None):
        raise PluginError(f"data set {name} returned a mapping of clients for one split "
                          f"and a single data set for the other: return the same shape "
                          f"for 'train' and 'validation'")
    extra = sorted(set(validation or ()) - set(train or ()))
    if extra:
        raise PluginError(f"data set {name} has validation data of client {extra[0]!r}, "
                          f"which has no training data")


@dataclass(frozen=True)
class Combined:
    """Several clients' data sets as one training and one validation part: each part's
    source (the data sets one after the other) and the items of it that the part holds,
    each client's positions in both parts, and each client's data sets by split (for its
    fingerprint)."""

    train: tuple[Any, np.ndarray]
    validation: tuple[Any, np.ndarray]
    train_positions: dict[str, np.ndarray]
    validation_positions: dict[str, np.ndarray]
    own: dict[str, dict[str, Any]]


def combined(named: dict[str, dict[str, Any] | None], fraction: float,
             seed: int) -> Combined:
    """The checked mappings of a plug-in's splits (``train`` and ``validation``, or
    ``all``, whose clients each hold out ``fraction`` of their own examples, a choice
    drawn from ``seed``) as one training and one validation part."""
    if "all" in named:
        return _held_out_each(named["all"] or {}, fraction, seed)
    train, validation = named["train"] or {}, named["validation"] or {}
    source, train_ranges = concatenated(train)
    held_source, held_ranges = concatenated(validation)
    own = {key: {"train": data, **({"validation": validation[key]} if key in validation
                                   else {})} for key, data in train.items()}
    return Combined((source, np.arange(len(source))), (held_source, np.arange(len(held_source))),
                    positions(train_ranges, list(train)), positions(held_ranges, list(train)),
                    own)


def _held_out_each(clients: dict[str, Any], fraction: float, seed: int) -> Combined:
    source, ranges = concatenated(clients)
    shares = {key: held_out_of(span, fraction, seed) for key, span in ranges.items()}
    kept = np.concatenate([train for train, _ in shares.values()])
    held = np.concatenate([held for _, held in shares.values()])
    return Combined((source, kept), (source, held),
                    _runs({key: len(train) for key, (train, _) in shares.items()}),
                    _runs({key: len(held) for key, (_, held) in shares.items()}),
                    {key: {"all": data} for key, data in clients.items()})


def held_out_of(span: range, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The items of ``span`` a client trains on and those held out for its validation:
    ``fraction`` of them (none when it has too few for one), at least one left to train
    on; a fixed choice, the same on every process."""
    size = len(span)
    count = min(round(size * fraction), size - 1) if size else 0
    chosen = np.random.default_rng(seed).permutation(size)[:count]
    mask = np.zeros(size, dtype=bool)
    mask[chosen] = True
    return np.flatnonzero(~mask) + span.start, np.flatnonzero(mask) + span.start


def concatenated(clients: dict[str, Any]) -> tuple[Any, dict[str, range]]:
    """The clients' data sets one after the other, and each one's range of positions."""
    if not clients:
        return [], {}
    return ConcatDataset(list(clients.values())), concatenated_ranges(
        {key: len(data) for key, data in clients.items()})


def positions(ranges: dict[str, range], names: list[str]) -> dict[str, np.ndarray]:
    """Each name's positions (an empty array for a name with no range)."""
    return {key: np.arange(ranges[key].start, ranges[key].stop, dtype=np.int64)
            if key in ranges else np.empty(0, dtype=np.int64) for key in names}


def _runs(sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Each name's positions when the names' items follow each other in order."""
    return positions(concatenated_ranges(sizes), list(sizes))


def concatenated_ranges(sizes: dict[str, int]) -> dict[str, range]:
    ranges, start = {}, 0
    for key, size in sizes.items():
        ranges[key] = range(start, start + size)
        start += size
    return ranges
