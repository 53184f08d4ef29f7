"""Training algorithms, by name."""

from training.algorithms.base import Algorithm, ConfigError, Registry

ALGORITHMS = Registry()
ALGORITHMS.register("delta_avg", "training.algorithms.delta_avg:DeltaAveraging")
ALGORITHMS.register("sync_sgd", "training.algorithms.sync_sgd:SyncSGD")
ALGORITHMS.register("md_gan", "training.algorithms.md_gan:MDGan")
ALGORITHMS.register("fl_gan", "training.algorithms.fl_gan:FLGan")


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class of that name, or a ConfigError listing the known ones."""
    return ALGORITHMS.get(name)


__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "get_algorithm"]
