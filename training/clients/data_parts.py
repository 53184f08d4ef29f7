"""The run's clients as parts of a torch model's training part, the same on every process.

The coordinator and every node compute the partition themselves from the run's ``clients``
settings, the algorithm's seed and their own copy of the data set (the labels of its
training part), and keep it while the run lasts: a unit names its client, never its
examples. The partition's fingerprint joins the run's facts (training/run_check.py), so a
node that would deal the examples otherwise is left out before round 1.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.errors import ClientsError
from thrift_trainer.training.clients.fingerprint import PartitionRecord, record_of
from thrift_trainer.training.clients.partitioners import partition
from thrift_trainer.training.clients.settings import ClientsSettings, client_index

if TYPE_CHECKING:
    from thrift_trainer.training.models.module_training import ModelSetup

KEPT = 4  # partitions kept per process: a node serves a few runs at once
_lock = threading.Lock()
_kept: OrderedDict[tuple, tuple[list[np.ndarray], PartitionRecord]] = OrderedDict()


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
    """The clients' example indices and the partition's record; ConfigError names a
    setting no rule can meet."""
    return label_parts((setup.data.fingerprint, len(setup.data.train)),
                       lambda: training_labels(setup), settings, seed)


def label_parts(data_key: tuple, labels_of: Callable[[], np.ndarray],
                settings: ClientsSettings,
                seed: int) -> tuple[list[np.ndarray], PartitionRecord]:
    """The clients' example indices and the partition's record of the training part
    whose labels ``labels_of()`` reads (once per ``data_key``, a fingerprint of the
    data set, its settings and seed); ConfigError names a setting no rule can meet."""
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
    made = (parts, record_of(parts, labels, settings.partition, seed,
                             **settings.partition_params()))
    with _lock:
        _kept[key] = made
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return made


def all_examples(setup: ModelSetup) -> np.ndarray:
    """Every example of a setup's training part: a node-resident client's."""
    return np.arange(len(setup.data.train))


def client_examples(client: str, settings: ClientsSettings,
                    seed: int) -> Callable[[ModelSetup], np.ndarray]:
    """The examples of ``client`` in a setup's training part, as `torch_model.local_unit`
    takes them."""
    def examples(setup: ModelSetup) -> np.ndarray:
        parts, _ = parts_of(setup, settings, seed)
        return parts[client_index(client, settings.count)]
    return examples
