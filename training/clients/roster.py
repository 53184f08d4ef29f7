"""The run's clients as an algorithm's coordinator half sees them: each one's examples,
one unit per client sampled for a round, and the count a round closes at.

sync_sgd and fl_gan keep one (delta_avg keeps the same facts in its `ClientPlan`). A
partitioned run knows its clients' sizes from its own partition; a node-resident run
learns them when the nodes announce their data (`take`).
"""

from __future__ import annotations

import numpy as np

from thrift_trainer.training.clients.fingerprint import PartitionRecord
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.units import UnitSpec, unit_seed


class ClientRoster:
    """Which clients there are, how many examples each holds, and a round's units."""

    def __init__(self, settings: ClientsSettings, seed: int, unit_path: str = "") -> None:
        self.settings, self.seed, self.unit_path = settings, seed, unit_path
        self.record = PartitionRecord("nodes", seed, "", [])
        self.sizes: dict[str, int] = {}
        self._units: dict[str, UnitSpec] = {}

    def deal(self, parts: list[np.ndarray], record: PartitionRecord) -> None:
        """A partitioned run's clients: the parts its partitioner dealt."""
        self.record = record
        self._set_sizes({name: len(part) for name, part in
                         zip(self.settings.names(), parts, strict=True)})

    def take(self, sizes: dict[str, int],
             labels: dict[str, dict[int, int] | None]) -> PartitionRecord:
        """Node-resident clients as their nodes announced them; returns their record."""
        names = sorted(sizes)
        self._set_sizes({name: sizes[name] for name in names})
        self.record = PartitionRecord("nodes", self.seed, "", [sizes[n] for n in names],
                                      [labels.get(n) or {} for n in names], names=names)
        return self.record

    def _set_sizes(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        # a client with no example has nothing to train (a plug-in rule may leave one)
        self._units = {name: UnitSpec(unit_id=name, unit_path=self.unit_path, client=name)
                       for name, size in sizes.items() if size}

    @property
    def count(self) -> int:
        """Clients with examples: those a round may ask."""
        return len(self._units)

    def round_units(self, round_index: int) -> list[UnitSpec]:
        """The units of the clients sampled for ``round_index``, over-selection included."""
        chosen = self.settings.sampled(round_index, self.seed, list(self._units))
        return [self._units[name] for name in chosen]

    def target(self) -> int:
        """The results an (over-selected) round closes at."""
        return self.settings.target(self.count)

    def examples(self, unit: UnitSpec) -> int | None:
        return self.sizes.get(unit.client or "")


def batch_of(examples: np.ndarray, size: int, seed: int, round_index: int,
             client: str) -> np.ndarray:
    """``size`` of a client's ``examples`` for one round (all of them when it holds no
    more), drawn without replacement from a seed of (seed, round, client): the same on
    any node that computes the unit, another batch each round."""
    if len(examples) <= size:
        return examples
    rng = np.random.default_rng(unit_seed(seed, round_index, client))
    return examples[np.sort(rng.choice(len(examples), size, replace=False))]
