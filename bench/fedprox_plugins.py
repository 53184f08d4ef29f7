"""Plug-ins of bench/fedprox_synthetic.py: Li et al.'s Synthetic(alpha, beta) devices as
one data set, each device one client, a multinomial logistic regression, and FedProx with
stragglers.

Every process of the benchmark allows this module (``--plugins fedprox_plugins
--plugin-dir bench``); a run names its parts:

* ``fedprox_plugins:synthetic_devices`` (``run.dataset``, ``data.args: {alpha, beta, seed,
  held_out, score}``): the 30 devices of training/clients/synthetic.py, concatenated device
  after device. Each device's last ``held_out`` share (20 %) is held out; the training part
  is every device's first 80 %. The validation part is the held-out examples
  (``score: held_out``) or the training part itself (``score: train``), so that the
  coordinator's per-round validation loss is the global model's training loss over all
  devices, the figure Li et al. plot.
* ``fedprox_plugins:device_parts`` (``clients.partition``): client k = device k's index
  range of the training part.
* ``fedprox_plugins:Multinomial`` (``run.model``): softmax regression, ``Linear(60, 10)``
  from zero weights.
* ``fedprox_plugins:StragglerFedProx`` (``run.algorithm``): examples/plugins/fedprox.py's
  FedProx (``mu``) whose sampled clients include stragglers: in every round the share
  ``stragglers`` of the round's sampled clients (those ranked first by a seeded hash of
  round and client) runs fewer local epochs, a number in 1..``epochs`` drawn by another
  hash. Every process computes the same stragglers from the run's settings. With
  ``drop_stragglers: true`` (FedAvg as Li et al. run it) the coordinator leaves their
  results out of the round's average (their nodes then take a single local step, whose
  result only the round's mean local loss counts); with false (FedProx) their partial work
  is averaged like the others'.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import thrift_trainer as tt
from thrift_trainer.training.clients.errors import ClientsError
from thrift_trainer.training.clients.settings import settings_from as clients_settings
from thrift_trainer.training.clients.synthetic import DEVICES, synthetic

_PLUGINS = str(Path(__file__).resolve().parent.parent / "examples" / "plugins")
if _PLUGINS not in sys.path:
    sys.path.insert(0, _PLUGINS)

from fedprox import FedProx  # noqa: E402  (examples/plugins/fedprox.py)

HELD_OUT = 0.2
SCORES = ("held_out", "train")

# Training labels' digest -> each device's number of training examples, written by
# `synthetic_devices` and read by `device_parts` in the same process (a plug-in
# partitioner is given the labels, the count and the seed, nothing else).
_layouts: dict[str, list[int]] = {}
_lock = threading.Lock()


# ------------------------------------------------------------------------- data set
class Devices:
    """A map-style data set of (features, label) pairs, devices one after another."""

    num_classes = 10

    def __init__(self, inputs: np.ndarray, targets: np.ndarray, sizes: list[int]) -> None:
        self.inputs = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
        self.targets = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.int64))
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.inputs.numpy().tobytes())
        digest.update(self.targets.numpy().tobytes())
        return digest.hexdigest()[:16]


def device_split(n: int, held_out: float) -> int:
    """How many of a device's ``n`` examples it trains on (at least one)."""
    return max(1, n - round(held_out * n))


def all_devices(alpha: float, beta: float, seed: int, held_out: float = HELD_OUT
                ) -> tuple[Devices, Devices]:
    """(training part, held-out part) of Synthetic(alpha, beta), devices in order."""
    if not 0 <= held_out < 1:
        raise ValueError(f"held_out must be in [0, 1), got {held_out}")
    devices = synthetic(float(alpha), float(beta), int(seed), DEVICES)
    train, held = [], []
    for inputs, labels in devices:
        cut = device_split(len(labels), held_out)
        train.append((inputs[:cut], labels[:cut]))
        held.append((inputs[cut:], labels[cut:]))
    parts = []
    for chosen in (train, held):
        parts.append(Devices(np.concatenate([x for x, _ in chosen]),
                             np.concatenate([y for _, y in chosen]),
                             [len(y) for _, y in chosen]))
    return parts[0], parts[1]


def synthetic_devices(split: str, alpha: float = 1.0, beta: float = 1.0, seed: int = 0,
                      held_out: float = HELD_OUT, score: str = "held_out") -> Devices:
    """Synthetic(alpha, beta)'s devices concatenated: the training part (``split``
    "train"), or the validation part: the held-out examples, or with ``score: train``
    the training part again (the coordinator then scores the global training loss)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    train, held = all_devices(alpha, beta, seed, held_out)
    with _lock:
        _layouts[labels_digest(train.targets.numpy())] = list(train.sizes)
    if split == "train" or score == "train":
        return train
    return held


def labels_digest(labels: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(labels, dtype=np.int64).tobytes()).hexdigest()


# ------------------------------------------------------------------------ partitioner
def device_parts(labels: np.ndarray, count: int, seed: int) -> list[np.ndarray]:
    """Client k = device k: the index range of its examples in `synthetic_devices`'s
    training part (the run's data set must be that one; ``clients.count`` = devices)."""
    with _lock:
        sizes = _layouts.get(labels_digest(labels))
    if sizes is None:
        raise ClientsError("device_parts deals fedprox_plugins:synthetic_devices' devices; "
                           "this run's data set is another")
    if count != len(sizes):
        raise ClientsError(f"device_parts: clients.count must be {len(sizes)} (one client "
                           f"per device), got {count}")
    stops = np.cumsum(sizes)
    return [np.arange(stop - size, stop, dtype=np.int64) for size, stop in zip(sizes, stops,
                                                                               strict=True)]


# ------------------------------------------------------------------------------ model
class Multinomial(nn.Module):
    """Multinomial logistic regression: one linear layer to the class scores (softmax in
    the loss), from zero weights as in Li et al.'s code."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


# ------------------------------------------------------------------------- stragglers
def _hash01(*parts: object) -> float:
    """A number in [0, 1) from the parts, the same in every process."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def stragglers_of(round_index: int, clients: Sequence[str], share: float,
                  seed: int) -> set[str]:
    """The round's stragglers: the ``share`` of its ``clients`` (rounded to the nearest
    count) that come first by a seeded hash of (round, client)."""
    count = math.floor(share * len(clients) + 0.5)
    ranked = sorted(clients, key=lambda name: (_hash01("straggler", seed, round_index, name),
                                               name))
    return set(ranked[:count])


def straggler_epochs(round_index: int, client: str, epochs: int, seed: int) -> int:
    """A straggler's local epochs this round: uniform in 1..``epochs``."""
    return 1 + int(_hash01("epochs", seed, round_index, client) * epochs)


def round_clients(config: Mapping[str, Any], round_index: int) -> list[str]:
    """The clients the run samples in ``round_index``, as the coordinator samples them
    (every client of this data set holds examples, so all are available)."""
    settings = clients_settings(config.get("clients"))
    return settings.sampled(round_index, config["seed"], settings.names())


def local_epochs(config: Mapping[str, Any], round_index: int, client: str) -> int:
    """The local epochs ``client`` runs in ``round_index``: ``epochs``, or a straggler's
    fewer."""
    share = config["stragglers"]
    if share and client in stragglers_of(round_index, round_clients(config, round_index),
                                         share, config["seed"]):
        return straggler_epochs(round_index, client, config["epochs"], config["seed"])
    return config["epochs"]


class StragglerFedProx(FedProx):
    """FedProx (``mu``) with stragglers (``stragglers``: their share of each round's
    sampled clients), kept (their partial work averaged) or dropped
    (``drop_stragglers``)."""

    name = "fedprox_stragglers"

    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        rest = dict(config)
        share = rest.pop("stragglers", 0.0)
        drop = rest.pop("drop_stragglers", False)
        if isinstance(share, bool) or not isinstance(share, int | float) \
                or not 0 <= share <= 1:
            raise tt.ConfigError(f"config key 'stragglers' must be a share in [0, 1], "
                                 f"got {share!r}")
        if not isinstance(drop, bool):
            raise tt.ConfigError(f"config key 'drop_stragglers' must be true or false, "
                                 f"got {drop!r}")
        checked = super().check_config(model, rest)
        if share and checked["local_steps"]:
            raise tt.ConfigError("stragglers shorten local epochs: leave local_steps at 0")
        return {**checked, "stragglers": float(share), "drop_stragglers": drop}

    # node half: a straggler's unit runs its fewer epochs
    @classmethod
    def run_unit(cls, job: tt.UnitJob, dataset_dir: Path) -> tt.UnitOutput:
        config = cls.unit_config(job)
        client = job.unit.client
        if client is not None and config["stragglers"]:
            epochs = local_epochs(config, job.round, client)
            if epochs != config["epochs"]:
                # dropped anyway: one step stands for the work the coordinator discards
                changed = {"local_steps": 1} if config["drop_stragglers"] else \
                    {"epochs": epochs}
                job = dataclasses.replace(job, checked_config={**config, **changed})
        return super().run_unit(job, dataset_dir)

    # coordinator half: FedAvg leaves the stragglers out
    def aggregate(self, round_index: int, weights: tt.Weights,
                  results: Sequence[tt.UnitResult], failures: Sequence[Any]) -> tt.Weights:
        if self.config["drop_stragglers"] and self.config["stragglers"]:
            late = stragglers_of(round_index, round_clients(self.config, round_index),
                                 self.config["stragglers"], self.config["seed"])
            results = [result for result in results if result.unit.client not in late]
            if not results:  # every sampled client straggled: the model stays
                return weights
        return super().aggregate(round_index, weights, results, failures)
