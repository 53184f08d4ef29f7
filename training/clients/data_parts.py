"""The run's clients as parts of a torch model's training part, the same on every process.

The coordinator and every node compute the partition themselves from the run's ``clients``
settings, the algorithm's seed and their own copy of the data set (the labels of its
training part), and keep it while the run lasts: a unit names its client, never its
examples. The partition's fingerprint joins the run's facts (training/run_check.py), so a
node that would deal the examples otherwise is left out before round 1.

With ``clients.validation_fraction`` each client's part is split once more, by a seeded
draw of its own (`split_validation`), into its training examples and its validation
part; the fingerprint then covers both, so a node that would split otherwise is left out
too.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.errors import ClientsError
from thrift_trainer.training.clients.fingerprint import PartitionRecord, fingerprint, record_of
from thrift_trainer.training.clients.partitioners import partition
from thrift_trainer.training.clients.settings import ClientsSettings, client_index

if TYPE_CHECKING:
    from thrift_trainer.training.data.client_sets import ClientParts
    from thrift_trainer.training.models.module_training import ModelSetup

Dealt = tuple[list[np.ndarray], list[np.ndarray], PartitionRecord]  # train, validation
KEPT = 4  # partitions kept per process: a node serves a few runs at once
_lock = threading.Lock()
_kept: OrderedDict[tuple, Dealt] = OrderedDict()
_VALIDATION_STREAM = 0x76616C  # "val": the split's draws apart from the partitioner's


def training_labels(setup: ModelSetup) -> np.ndarray:
    """The training part's labels as integers; all 0 for real targets (regression), which
    only the label-blind rules (iid, quantity) can split."""
    train = setup.data.train
    targets = getattr(train, "targets", None)
    if targets is None:
        targets = train.take(np.arange(len(train)))[1]
    labels = targets.numpy() if hasattr(targets, "numpy") else np.asarray(targets)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        return np.zeros(len(train), dtype=np.int64)
    return labels.astype(np.int64)


def parts_of(setup: ModelSetup, settings: ClientsSettings,
             seed: int) -> tuple[list[np.ndarray], PartitionRecord]:
    """The clients' training examples and the partition's record; ConfigError names a
    setting no rule can meet."""
    train, _, record = dealt(setup, settings, seed)
    return train, record


def validation_parts_of(setup: ModelSetup, settings: ClientsSettings,
                        seed: int) -> list[np.ndarray]:
    """The clients' validation examples (empty arrays without a validation_fraction)."""
    return dealt(setup, settings, seed)[1]


def dealt(setup: ModelSetup, settings: ClientsSettings, seed: int) -> Dealt:
    """(training parts, validation parts, record) of a torch model's training part."""
    return dealt_by_labels((setup.data.fingerprint, len(setup.data.train)),
                           lambda: training_labels(setup), settings, seed)


def label_parts(data_key: tuple, labels_of: Callable[[], np.ndarray],
                settings: ClientsSettings,
                seed: int) -> tuple[list[np.ndarray], PartitionRecord]:
    """The clients' training examples and the partition's record of a training part whose
    labels ``labels_of()`` reads (a GAN's MNIST images); ConfigError names a setting no
    rule can meet."""
    train, _, record = dealt_by_labels(data_key, labels_of, settings, seed)
    return train, record


def dealt_by_labels(data_key: tuple, labels_of: Callable[[], np.ndarray],
                    settings: ClientsSettings, seed: int) -> Dealt:
    """(training parts, validation parts, record), computed once per process and
    ``data_key`` (a fingerprint of the data set), settings and seed."""
    key = (*data_key, settings, seed)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    labels = labels_of()
    try:
        parts = partition(settings.partition, labels, settings.count, seed,
                          **settings.partition_params())
    except ClientsError as exc:
        raise ConfigError(f"clients: {exc}") from None
    made = _split_all(parts, labels, settings, seed)
    with _lock:
        _kept[key] = made
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return made


def _split_all(parts: list[np.ndarray], labels: np.ndarray, settings: ClientsSettings,
               seed: int) -> Dealt:
    """Each part split into training and validation examples, with the record; without a
    validation_fraction the parts and the record are exactly what they were before."""
    params = settings.partition_params()
    if not settings.validation_fraction:
        empty = [np.empty(0, dtype=np.int64) for _ in parts]
        return parts, empty, record_of(parts, labels, settings.partition, seed, **params)
    pairs = [split_validation(part, settings.validation_fraction, seed, index)
             for index, part in enumerate(parts)]
    train = [pair[0] for pair in pairs]
    held = [pair[1] for pair in pairs]
    record = record_of(train, labels, settings.partition, seed, **params)
    record = replace(record, fingerprint=fingerprint(train + held),
                     validation_sizes=[int(len(part)) for part in held])
    return train, held, record


def split_validation(part: np.ndarray, fraction: float, seed: int,
                     index: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) examples of client ``index``'s ``part``: floor(fraction x
    size) of them held out at random, drawn from (seed, index) alone, so every process
    splits alike and a client's split moves no other's. At least one example is left to
    train on; both halves sorted."""
    part = np.asarray(part, dtype=np.int64)
    held = min(max(part.size - 1, 0), math.floor(round(fraction * part.size, 9)))
    rng = np.random.Generator(np.random.PCG64([int(seed), int(index), _VALIDATION_STREAM]))
    chosen = np.zeros(part.size, dtype=bool)
    chosen[rng.choice(part.size, size=held, replace=False)] = True
    return np.sort(part[~chosen]), np.sort(part[chosen])


def all_examples(setup: ModelSetup) -> np.ndarray:
    """Every example of a setup's training part: a node-resident client's."""
    return np.arange(len(setup.data.train))


def own_examples(settings: ClientsSettings, seed: int,
                 client: str | None = None) -> Callable[[ModelSetup], np.ndarray]:
    """A node-resident client's training examples: its node's whole training part (or,
    where the data set holds several named clients, ``client``'s own examples), less the
    validation_fraction held out when it has no validation part of its own."""
    def examples(setup: ModelSetup) -> np.ndarray:
        return _own_parts(setup, settings, seed, client)[0]
    return examples


def resident_examples(client: str | None) -> Callable[[ModelSetup], np.ndarray]:
    """A node-resident client's examples, none held out: its node's whole training part, or
    the named client's own examples."""
    def examples(setup: ModelSetup) -> np.ndarray:
        named = own_clients(setup)
        return _named(named, client).train if named else all_examples(setup)
    return examples


def own_clients(setup: ModelSetup) -> dict[str, ClientParts]:
    """The named clients of a node's data set (a plug-in that returned several); empty
    when the data set is one client."""
    return getattr(setup.data, "clients", None) or {}


def _named(named: dict[str, ClientParts], client: str | None) -> ClientParts:
    if client not in named:
        raise ConfigError(f"the data set holds no client {client!r} (it holds "
                          f"{', '.join(list(named)[:5])}{', ...' if len(named) > 5 else ''})")
    return named[client]


def _own_parts(setup: ModelSetup, settings: ClientsSettings, seed: int,
               client: str | None) -> tuple[np.ndarray, Any]:
    """(training examples, validation split) of a node-resident client."""
    named = own_clients(setup)
    if named:
        parts = _named(named, client)
        train, validation = parts.train, Subset(setup.data.validation, parts.validation)
        stream = zlib.crc32(str(client).encode())  # each client's held-out draw its own
    else:
        train, validation, stream = all_examples(setup), setup.data.validation, 0
    if not settings.validation_fraction or len(validation):
        return train, validation
    kept, held = split_validation(train, settings.validation_fraction, seed, stream)
    return kept, Subset(setup.data.train, held)


def client_examples(client: str, settings: ClientsSettings,
                    seed: int) -> Callable[[ModelSetup], np.ndarray]:
    """The examples of ``client`` in a setup's training part, as `torch_model.local_unit`
    takes them."""
    def examples(setup: ModelSetup) -> np.ndarray:
        parts, _ = parts_of(setup, settings, seed)
        return parts[client_index(client, settings.count)]
    return examples


def client_validation(client: str, settings: ClientsSettings,
                      seed: int) -> Callable[[ModelSetup], np.ndarray]:
    """The validation examples of ``client`` (indices into a setup's training part)."""
    def examples(setup: ModelSetup) -> np.ndarray:
        return validation_parts_of(setup, settings, seed)[client_index(client,
                                                                       settings.count)]
    return examples


class Subset:
    """Some examples of a split, as `module_training.evaluate` reads a split."""

    def __init__(self, split: Any, indices: np.ndarray) -> None:
        self.split, self.indices = split, np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.indices.size)

    def take(self, indices: np.ndarray) -> Any:
        return self.split.take(self.indices[np.asarray(indices, dtype=np.int64)])


def validation_split(client: str, settings: ClientsSettings,
                     seed: int) -> Callable[[ModelSetup], Any]:
    """A client's validation part as a split: a partitioned client's held-out share; a
    node-resident client's data set validation part, or else its held-out share."""
    def split(setup: ModelSetup) -> Any:
        if not settings.on_nodes:
            return Subset(setup.data.train, client_validation(client, settings, seed)(setup))
        return _own_parts(setup, settings, seed, client)[1]
    return split
