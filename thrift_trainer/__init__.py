"""The plug-in API of the distributed trainer: what a plug-in author writes against.

Bring your own model, data set, algorithm, aggregation rule or codec (docs/plugins.md)::

    import thrift_trainer as tt

    class FedProx(tt.algorithms.DeltaAveraging): ...
    tt.register_aggregation("geomed", geometric_median)

and train from a notebook or a script (docs/notebooks.md)::

    with tt.local_cluster(nodes=2) as cluster:
        result = cluster.train({"run": {"model": "mlp_classifier", "rounds": 3}})

Names are loaded on first use, so ``import thrift_trainer`` costs nothing (no torch).
Everything outside this package is the trainer's own and may change between versions.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# The trainer's own packages are thrift_trainer.coordinator, .training, .wire, ... and the
# generated Thrift code thrift_trainer.trainer_rpc: an installed distribution holds them
# inside this package; in a clone of the repository they lie beside it (coordinator/, ...,
# gen-py/trainer_rpc/), so this package's path reaches there too. Nothing of the trainer is
# a top-level module, so a user's own `training` or `engine` never meets ours.
_CLONE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_CLONE, "coordinator_node.py")):
    __path__ += [_CLONE, os.path.join(_CLONE, "gen-py")]

# public name -> "module:attribute" it is taken from
_EXPORTS = {
    "Algorithm": "thrift_trainer.training.algorithms.base:Algorithm",
    "AveragingAlgorithm": "thrift_trainer.training.algorithms.base:AveragingAlgorithm",
    "ConfigError": "thrift_trainer.training.algorithms.config_checks:ConfigError",
    "RoundEval": "thrift_trainer.training.units:RoundEval",
    "UnitFailure": "thrift_trainer.training.units:UnitFailure",
    "UnitJob": "thrift_trainer.training.units:UnitJob",
    "UnitOutput": "thrift_trainer.training.units:UnitOutput",
    "UnitResult": "thrift_trainer.training.units:UnitResult",
    "UnitSpec": "thrift_trainer.training.units:UnitSpec",
    "Weights": "thrift_trainer.training.units:Weights",
    "register_algorithm": "thrift_trainer.training.algorithms:register_algorithm",
    "register_aggregation": "thrift_trainer.training.aggregation:register_aggregation",
    "Codec": "thrift_trainer.training.codecs:Codec",
    "register_codec": "thrift_trainer.training.codecs:register_codec",
    "DataShape": "thrift_trainer.training.models.settings:DataShape",
    "PluginError": "thrift_trainer.training.plugins:PluginError",
    "load_weights": "thrift_trainer.training.outputs.torch_files:load_weights",
    "MapDataset": "thrift_trainer.specs:MapDataset",
    "DatasetFactory": "thrift_trainer.specs:DatasetFactory",
    "ModelFactory": "thrift_trainer.specs:ModelFactory",
    "LossFunction": "thrift_trainer.specs:LossFunction",
    "MetricFunction": "thrift_trainer.specs:MetricFunction",
    # training from a notebook or a script (docs/notebooks.md)
    "local_cluster": "thrift_trainer.cluster:local_cluster",
    "LocalCluster": "thrift_trainer.cluster:LocalCluster",
    "ClusterError": "thrift_trainer.cluster:ClusterError",
    "Coordinator": "thrift_trainer.api:Coordinator",
    "RoundInfo": "thrift_trainer.api:RoundInfo",
    "TrainingError": "thrift_trainer.api:TrainingError",
    "TrainingResult": "thrift_trainer.results:TrainingResult",
    "RunConfigError": "thrift_trainer.training.run_config:RunConfigError",
}
_SUBMODULES = {"algorithms": "thrift_trainer.algorithms"}

__all__ = [  # the same names as _EXPORTS and _SUBMODULES (a test keeps them equal)
    "Algorithm", "AveragingAlgorithm", "ClusterError", "Codec", "ConfigError", "Coordinator",
    "DataShape", "DatasetFactory", "LocalCluster", "LossFunction", "MapDataset",
    "MetricFunction", "ModelFactory", "PluginError", "RoundEval", "RoundInfo",
    "RunConfigError", "TrainingError", "TrainingResult", "UnitFailure", "UnitJob",
    "UnitOutput", "UnitResult", "UnitSpec", "Weights", "__version__", "algorithms",
    "load_weights", "local_cluster", "register_aggregation", "register_algorithm",
    "register_codec",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    if name not in _EXPORTS:
        raise AttributeError(f"module 'thrift_trainer' has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what type checkers and editors see
    from thrift_trainer import algorithms
    from thrift_trainer.api import Coordinator, RoundInfo, TrainingError
    from thrift_trainer.cluster import ClusterError, LocalCluster, local_cluster
    from thrift_trainer.results import TrainingResult
    from thrift_trainer.specs import (
        DatasetFactory,
        LossFunction,
        MapDataset,
        MetricFunction,
        ModelFactory,
    )
    from thrift_trainer.training.aggregation import register_aggregation
    from thrift_trainer.training.algorithms import register_algorithm
    from thrift_trainer.training.algorithms.base import Algorithm, AveragingAlgorithm
    from thrift_trainer.training.algorithms.config_checks import ConfigError
    from thrift_trainer.training.codecs import Codec, register_codec
    from thrift_trainer.training.models.settings import DataShape
    from thrift_trainer.training.outputs.torch_files import load_weights
    from thrift_trainer.training.plugins import PluginError
    from thrift_trainer.training.run_config import RunConfigError
    from thrift_trainer.training.units import (
        RoundEval,
        UnitFailure,
        UnitJob,
        UnitOutput,
        UnitResult,
        UnitSpec,
        Weights,
    )
