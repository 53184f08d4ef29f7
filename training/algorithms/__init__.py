"""Training algorithms, by name."""

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.registry import Registry

ALGORITHMS = Registry()
ALGORITHMS.register("delta_avg", "thrift_trainer.training.algorithms.delta_avg:DeltaAveraging")
ALGORITHMS.register("sync_sgd", "thrift_trainer.training.algorithms.sync_sgd:SyncSGD")
ALGORITHMS.register("md_gan", "thrift_trainer.training.algorithms.md_gan:MDGan")
ALGORITHMS.register("fl_gan", "thrift_trainer.training.algorithms.fl_gan:FLGan")


def register_algorithm(name: str, algorithm: type[Algorithm]) -> None:
    """Make ``algorithm`` usable as ``run.algorithm: name`` (e.g. by an installed plug-in
    package, when it is imported)."""
    if not (isinstance(algorithm, type) and issubclass(algorithm, Algorithm)):
        raise TypeError(f"{algorithm!r} is not a subclass of Algorithm")
    ALGORITHMS.register(name, f"{algorithm.__module__}:{algorithm.__qualname__}")


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class of that name, or a ConfigError listing the known ones."""
    return ALGORITHMS.get(name)


__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "get_algorithm", "register_algorithm"]
