"""Training algorithms, by name."""

from training.algorithms.base import Algorithm, ConfigError, Registry
from training.algorithms.delta_avg import DeltaAveraging

ALGORITHMS = Registry()
ALGORITHMS.register(DeltaAveraging)


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class of that name, or a ConfigError listing the known ones."""
    return ALGORITHMS.get(name)


__all__ = ["ALGORITHMS", "Algorithm", "ConfigError", "get_algorithm"]
