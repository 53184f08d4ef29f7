"""Partitioners: how a data set's examples are dealt to federated clients.

Each is a pure function ``(labels, count, seed, <its own parameters>) -> parts``: one
sorted int64 array of example indices per client, disjoint, covering the data set unless
the rule says it drops examples. The same arguments give the same parts on every process
(a numpy Generator over PCG64 seeded with ``seed``); `fingerprint.py` hashes them so that
processes can check they agree. The vocabulary is that of FL papers (and Flower Datasets):

- `iid`: a random split into equal sizes (within one example).
- `dirichlet`: label skew. For each label, shares over the clients are drawn from
  Dirichlet(alpha) and its examples split by them; small alpha gives each client few
  labels, large alpha approaches `iid`.
- `shards`: McMahan et al. 2017's pathological split: sorted by label, cut into
  count x shards_per_client shards, each client given shards_per_client random ones.
- `classes`: each client holds classes_per_client labels, a label's examples split equally
  among its holders.
- `quantity`: size skew with IID labels: sizes drawn from a lognormal or power law.

Settings no rule can meet raise `ClientsError` with one line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from thrift_trainer.training.clients.errors import ClientsError

Parts = list[np.ndarray]
SIZE_LAWS = ("lognormal", "power")


def rng_of(seed: int) -> np.random.Generator:
    """The generator every rule draws from: PCG64 is numpy's default bit generator, and
    naming it keeps the stream fixed should the default change."""
    return np.random.Generator(np.random.PCG64(seed))


# ------------------------------------------------------------------------ the rules
def iid(labels: np.ndarray, count: int, seed: int) -> Parts:
    """A uniformly random split into ``count`` clients of equal size (within one)."""
    labels = checked_labels(labels, count)
    order = rng_of(seed).permutation(labels.size)
    return _sorted_parts(np.array_split(order, count))


def dirichlet(labels: np.ndarray, count: int, seed: int, alpha: float = 0.5,
              min_size: int = 10, max_draws: int = 100) -> Parts:
    """Label skew with concentration ``alpha``: each label's examples are split over the
    clients by shares drawn from Dirichlet(alpha, ..., alpha).

    A small alpha can leave a client (nearly) empty; as the code of FedMA (Wang et al.
    2020) and NIID-Bench (Li et al. 2021) does, the whole draw is repeated while some client has
    fewer than ``min_size`` examples, at most ``max_draws`` times, and then refused."""
    labels = checked_labels(labels, count)
    _check_number("dirichlet: alpha", alpha, positive=True)
    _check_int("dirichlet: min_size", min_size, 0)
    _check_int("dirichlet: max_draws", max_draws, 1)
    _check_room(f"{count} clients of at least {min_size} examples", count * min_size,
                labels.size)
    rng = rng_of(seed)
    by_label = [rng.permutation(np.flatnonzero(labels == label))
                for label in np.unique(labels)]
    for _ in range(max_draws):
        parts = _dirichlet_draw(by_label, count, alpha, rng)
        if min(part.size for part in parts) >= min_size:
            return _sorted_parts(parts)
    raise ClientsError(f"dirichlet: {max_draws} draws left some of {count} clients under "
                       f"{min_size} examples; raise alpha ({alpha}) or lower min_size")


def _dirichlet_draw(by_label: list[np.ndarray], count: int, alpha: float,
                    rng: np.random.Generator) -> Parts:
    pieces: list[list[np.ndarray]] = [[] for _ in range(count)]
    for indices in by_label:
        shares = rng.dirichlet(np.full(count, alpha))
        cuts = (np.cumsum(shares)[:-1] * indices.size).astype(np.int64)
        for client, piece in enumerate(np.split(indices, cuts)):
            pieces[client].append(piece)
    return [np.concatenate(piece) for piece in pieces]


def shards(labels: np.ndarray, count: int, seed: int, shards_per_client: int = 2) -> Parts:
    """Sorted by label (in random order within a label), cut into count x
    shards_per_client shards of equal size (within one), and each client given
    shards_per_client shards at random. With shards no larger than a label's examples a
    client sees at most shards_per_client labels (each shard may straddle two labels)."""
    labels = checked_labels(labels, count)
    _check_int("shards: shards_per_client", shards_per_client, 1)
    total = count * shards_per_client
    _check_room(f"{total} shards ({count} clients x {shards_per_client})", total,
                labels.size)
    rng = rng_of(seed)
    shuffled = rng.permutation(labels.size)
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, total)
    dealt = rng.permutation(total).reshape(count, shards_per_client)
    return _sorted_parts(np.concatenate([pieces[s] for s in row]) for row in dealt)


def classes(labels: np.ndarray, count: int, seed: int, classes_per_client: int = 2) -> Parts:
    """Each client holds ``classes_per_client`` labels; a label's examples are split
    equally (within one) among the clients that hold it.

    Labels are dealt the least-held first (ties at random), so every label is held once
    before any is held twice. When count x classes_per_client is below the number of
    labels some labels are held by no client: their examples are dropped."""
    labels = checked_labels(labels, count)
    kinds = np.unique(labels)
    _check_int("classes: classes_per_client", classes_per_client, 1)
    if classes_per_client > kinds.size:
        raise ClientsError(f"classes: classes_per_client {classes_per_client} is above the "
                           f"{kinds.size} labels of the data set")
    rng = rng_of(seed)
    held = _deal_labels(count, kinds.size, classes_per_client, rng)
    pieces: list[list[np.ndarray]] = [[] for _ in range(count)]
    for position, label in enumerate(kinds):
        holders = np.flatnonzero(held[:, position])
        indices = rng.permutation(np.flatnonzero(labels == label))
        if holders.size > indices.size:
            raise ClientsError(f"classes: label {label} has {indices.size} examples for "
                               f"{holders.size} clients that hold it")
        if holders.size == 0:
            continue  # no client holds the label: its examples are dropped
        for client, piece in zip(holders, np.array_split(indices, holders.size), strict=True):
            pieces[client].append(piece)
    return _sorted_parts(np.concatenate(piece) for piece in pieces)


def _deal_labels(count: int, kinds: int, per_client: int,
                 rng: np.random.Generator) -> np.ndarray:
    """(count, kinds) booleans: which label positions each client holds."""
    held = np.zeros((count, kinds), dtype=bool)
    times = np.zeros(kinds)
    for client in range(count):
        # a random fraction below 1 breaks ties among the least-held labels only
        chosen = np.argsort(times + rng.random(kinds), kind="stable")[:per_client]
        held[client, chosen] = True
        times[chosen] += 1
    return held


def quantity(labels: np.ndarray, count: int, seed: int, size_skew: float = 1.0,
             law: str = "lognormal", min_size: int = 1) -> Parts:
    """Size skew, labels IID: client sizes in proportion to weights drawn from a lognormal
    (sigma = size_skew) or a power law (Pareto of shape 1 / size_skew), each client
    given at least ``min_size`` examples. size_skew 0 gives equal sizes; larger is more
    skewed."""
    labels = checked_labels(labels, count)
    _check_number("quantity: size_skew", size_skew, positive=False)
    if law not in SIZE_LAWS:
        raise ClientsError(f"quantity: law must be one of {', '.join(SIZE_LAWS)}, "
                           f"got {law!r}")
    _check_int("quantity: min_size", min_size, 1)
    _check_room(f"{count} clients of at least {min_size} examples", count * min_size,
                labels.size)
    rng = rng_of(seed)
    sizes = _sizes(_log_weights(rng, count, size_skew, law), labels.size, min_size)
    order = rng.permutation(labels.size)
    return _sorted_parts(np.split(order, np.cumsum(sizes)[:-1]))


def _log_weights(rng: np.random.Generator, count: int, skew: float, law: str) -> np.ndarray:
    """Log-weights, so that a large skew cannot overflow the weights themselves."""
    if law == "lognormal":
        return skew * rng.standard_normal(count)
    # U^(-skew), U uniform on (0, 1], is Pareto with shape 1/skew: P(w > x) = x^(-1/skew)
    return -skew * np.log1p(-rng.random(count))


def _sizes(log_weights: np.ndarray, total: int, min_size: int) -> np.ndarray:
    """Sizes summing to ``total``, each ``min_size`` plus its share of the rest; the
    examples rounding leaves go to the largest fractional parts."""
    weights = np.exp(log_weights - log_weights.max())
    rest = total - min_size * weights.size
    share = weights / weights.sum() * rest
    sizes = np.floor(share).astype(np.int64)
    sizes[np.argsort(sizes - share, kind="stable")[:rest - int(sizes.sum())]] += 1
    return sizes + min_size


# ------------------------------------------------------------------------ checks
def checked_labels(labels: Any, count: int) -> np.ndarray:
    """``labels`` as a 1-D integer array, once ``count`` clients can each have one."""
    array = np.asarray(labels)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ClientsError(f"labels must be a 1-D array of integers, got shape "
                           f"{array.shape} of {array.dtype}")
    _check_int("the client count", count, 1)
    if count > array.size:
        raise ClientsError(f"{count} clients for {array.size} examples: a client needs at "
                           f"least one")
    return array


def _check_int(what: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ClientsError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _check_number(what: str, value: Any, positive: bool) -> None:
    ok = (isinstance(value, int | float | np.integer | np.floating)
          and not isinstance(value, bool) and math.isfinite(value)
          and (value > 0 if positive else value >= 0))
    if not ok:
        raise ClientsError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, "
                           f"got {value!r}")


def _check_room(what: str, needed: int, size: int) -> None:
    if needed > size:
        raise ClientsError(f"{what} need {needed} examples; the data set has {size}")


def _sorted_parts(parts: Iterable[np.ndarray]) -> Parts:
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]
