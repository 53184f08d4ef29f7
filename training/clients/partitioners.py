"""The partitioners by name: the built-in rules, registered ones, and plug-ins named as
``module:function`` (resolved through training/plugins.py like every plug-in), called
with their own parameters and their parts checked.

A partitioner of one's own is a function ``(labels, count, seed, **params) -> parts``
(one integer index array per client, disjoint); `partition` sorts its parts and refuses
overlapping or out-of-range ones, so a plug-in cannot hand the engine a partition the
built-ins could not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from thrift_trainer.training import plugins
from thrift_trainer.training.clients import partition as rules
from thrift_trainer.training.clients.errors import ClientsError

Partitioner = Callable[..., rules.Parts]
PARTITIONERS: dict[str, Partitioner] = {
    "iid": rules.iid,
    "dirichlet": rules.dirichlet,
    "shards": rules.shards,
    "classes": rules.classes,
    "quantity": rules.quantity,
}


def register_partitioner(name: str, function: Partitioner) -> None:
    """Make ``function`` usable by the plain ``name`` (e.g. from an installed plug-in)."""
    if not name or plugins.SEPARATOR in name:
        raise ValueError(f"a partitioner's name must be plain, got {name!r}")
    PARTITIONERS[name] = function


def partitioner_of(name: str) -> Partitioner:
    """The partitioner of a registered name or of a plug-in ``module:function``."""
    if name in PARTITIONERS:
        return PARTITIONERS[name]
    if plugins.is_plugin_name(name):
        return plugins.resolve(name, "partitioner")
    raise ClientsError(f"unknown partitioner {name!r}: one of {', '.join(PARTITIONERS)} "
                       f"or a plug-in module:function")


def partition(name: str, labels: np.ndarray, count: int, seed: int,
              **params: Any) -> rules.Parts:
    """The parts the partitioner ``name`` gives ``count`` clients of ``labels``; unknown
    parameters and parts that are not a partition raise ClientsError."""
    function = partitioner_of(name)
    labels = rules.checked_labels(labels, count)
    try:
        inspect.signature(function).bind(labels, count, seed, **params)
    except TypeError as exc:  # a parameter it does not take, named in the message
        raise ClientsError(f"partitioner {name}: {exc}") from None
    return checked_parts(function(labels, count, seed, **params), labels.size, count, name)


def checked_parts(parts: Any, size: int, count: int, name: str = "partitioner") -> rules.Parts:
    """``parts`` as sorted int64 arrays, once they are ``count`` disjoint sets of indices
    below ``size``."""
    if not isinstance(parts, list | tuple) or len(parts) != count:
        got = len(parts) if isinstance(parts, list | tuple) else type(parts).__name__
        raise ClientsError(f"{name} gave {got} parts for {count} clients")
    arrays = [np.asarray(part) for part in parts]
    for client, array in enumerate(arrays):
        if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
            raise ClientsError(f"{name}: client {client}'s part is not a 1-D integer array")
    joined = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    if joined.size and (joined.min() < 0 or joined.max() >= size):
        raise ClientsError(f"{name} gave indices outside 0..{size - 1}")
    if np.unique(joined).size != joined.size:
        raise ClientsError(f"{name} gave an example to more than one client")
    return [np.sort(array.astype(np.int64)) for array in arrays]
