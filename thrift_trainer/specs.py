"""What a model, data set, loss or metric plug-in is, as types (docs/plugins.md).

These are protocols: a plug-in does not subclass them, it only has their shape. Type
checkers (the package ships ``py.typed``) check a plug-in against them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn


@runtime_checkable
class MapDataset(Protocol):
    """What ``run.dataset: module:function`` returns: examples by index, each an
    ``(input, target)`` pair of tensors, arrays or numbers. It may also define
    ``num_classes`` (int) and ``fingerprint()`` (str: equal on nodes with the same data)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Any, Any]: ...


class DatasetFactory(Protocol):
    """``run.dataset: module:function``: called with the keyword arguments it declares
    among ``root`` (the process's data root) and ``split`` ("train" or "validation"), and
    the run's ``data.args``."""

    def __call__(self, *, root: Path = ..., split: str = ..., **args: Any) -> MapDataset: ...


class ModelFactory(Protocol):
    """``run.model: module:attribute``: an ``nn.Module`` class or a function returning one,
    called with ``run.model_args`` (``in_features``, ``num_classes`` and ``input_shape``
    filled from the data set when it takes them and the run does not give them)."""

    def __call__(self, **args: Any) -> nn.Module: ...


class LossFunction(Protocol):
    """``run.loss: module:function``: the training step's loss of one batch, a 0-d tensor;
    it runs the forward pass itself."""

    def __call__(self, model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor: ...


class MetricFunction(Protocol):
    """``run.metric: module:function``: a batch's mean score, lower is better (the run's
    "validation error")."""

    def __call__(self, model: nn.Module, inputs: Tensor, targets: Tensor) -> float: ...
