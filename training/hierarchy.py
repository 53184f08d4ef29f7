"""How relays train their group: the ``hierarchy`` section of a run's configuration.

* ``relay_local_rounds``: H (default 1). With H = 1 a relay computes each unit from above
  once on its group, as it always has. With H > 1 a relay splits each unit into one
  share per member and runs H rounds of its own over them: every member trains on its
  share from the group's weights, the relay averages their deltas (weighted by samples)
  into the group's weights, and after H rounds it returns the group's whole change as
  one update (hierarchical FedAvg). The coordinator's version counter counts its own
  updates only.

Local rounds need an update that is a change of the model, so they are for
``delta_avg``. Like ``compression`` and ``schedule``, the section travels inside a
request's config only when it is not the default (a request without it is exactly what
it was before), and the coordinator and the nodes take it out before the algorithm sees
the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError, section_mapping

SECTION = "hierarchy"
KEYS = ("relay_local_rounds",)
MAX_LOCAL_ROUNDS = 100


@dataclass(frozen=True)
class HierarchySettings:
    relay_local_rounds: int = 1

    @property
    def local_rounds(self) -> bool:
        return self.relay_local_rounds > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FLAT = HierarchySettings()


def split_hierarchy(config: Mapping[str, Any]) -> tuple[dict[str, Any], HierarchySettings]:
    """A request's config without its ``hierarchy`` key, and the checked settings."""
    rest = {key: value for key, value in config.items() if key != SECTION}
    return rest, settings_from(config.get(SECTION))


def join_hierarchy(config: Mapping[str, Any], settings: HierarchySettings) -> dict[str, Any]:
    """The config nodes get: with the section only when it asks for local rounds."""
    return {**config, SECTION: settings.to_dict()} if settings.local_rounds else dict(config)


def settings_from(raw: Any) -> HierarchySettings:
    """Checked settings from a ``hierarchy`` mapping; ConfigError names the bad key."""
    if raw is None:
        return FLAT
    raw = section_mapping(SECTION, raw, KEYS)
    rounds = raw.get("relay_local_rounds", FLAT.relay_local_rounds)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not (
            1 <= rounds <= MAX_LOCAL_ROUNDS):
        raise ConfigError(f"{SECTION}.relay_local_rounds must be an integer in "
                          f"1..{MAX_LOCAL_ROUNDS}, got {rounds!r}")
    return HierarchySettings(relay_local_rounds=rounds)


def check_usable(settings: HierarchySettings, algorithm: type[Algorithm]) -> None:
    """ConfigError unless the algorithm can train in local rounds (`Algorithm.local_rounds`:
    its update is a change of the model)."""
    if settings.local_rounds and not algorithm.local_rounds:
        raise ConfigError(f"{SECTION}.relay_local_rounds: {algorithm.name} cannot train in "
                          f"local rounds on relays (its update is not a change of the model)")
