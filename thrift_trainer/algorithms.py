"""The built-in algorithms, to subclass (e.g. FedProx from delta averaging)."""

from training.algorithms.delta_avg import DeltaAveraging
from training.algorithms.sync_sgd import SyncSGD

__all__ = ["DeltaAveraging", "SyncSGD"]
