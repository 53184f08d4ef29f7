"""The built-in algorithms, to subclass (e.g. FedProx from delta averaging)."""

from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.algorithms.sync_sgd import SyncSGD

__all__ = ["DeltaAveraging", "SyncSGD"]
