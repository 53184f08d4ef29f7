"""A run's federated clients: the ``clients`` section of its configuration.

* ``placement``: ``partition`` (research on one data set: every process deals the same data
  set to the clients) or ``nodes`` (real federation: each node's own copy of
  ``run.dataset``, whatever its files, sizes and labels, is one client, named by the
  node's id, or several clients where a data set plug-in returns a mapping of names to
  data sets (training/data/client_sets.py); the coordinator's copy is its validation data
  and fixes the model's shape).
* ``count``: partition: C clients, each a named piece of the training part (``client0``
  ..); 0 (the default) has none: units are index ranges of the whole data set, as before.
* ``partition``: the seeded rule that deals the examples (training/clients/partition.py:
  iid, dirichlet, shards, classes, quantity, or a plug-in ``module:function``), with its
  parameters ``alpha``, ``shards_per_client``, ``classes_per_client`` and ``size_skew``.
  The seed is the algorithm's (its ``seed``, by default ``run.seed``).
* ``per_round``: clients asked per round: 0 all of them, a count (>= 1), or a fraction in
  (0, 1) of the clients there are; ``over_select`` >= 1 asks that many times more and
  closes the round once the target count is in (Bonawitz et al. 2019); the late ones
  are cancelled. In the async and buffered modes ``per_round`` is how many clients train
  at once (FedBuff's concurrency, engine/client_draws.py) and ``over_select`` must be 1.
* ``sampling``: ``fixed`` (the default: ``per_round`` clients each round, as above) or
  ``poisson``: each client independently with probability q = per_round / count (the
  target count over the clients there are), seeded per round, so a round may have more or
  fewer clients, or none; the sampling differentially private training accounts for
  (docs/privacy.md). Sync rounds only, without over-selection.
* ``validation_fraction``: the share of each client's examples held out as its own
  validation part (a seeded split, training/clients/data_parts.py); 0 (the default) holds
  none. Node-resident clients use their data set's validation part when it has one.
* ``eval_every``: every N rounds (and after the last) the global model is scored on the
  validation parts of a sample of clients, on their holders (federated evaluation); 0
  (the default) never. ``eval_per_round`` picks how many, as ``per_round`` does (0 all,
  a count, or a fraction), drawn independently of the training sample.

Like ``hierarchy``, the section travels inside a request's config only when the run has
clients, so a request without it is exactly what it was before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from thrift_trainer.training.algorithms.config_checks import ConfigError, checked_section
from thrift_trainer.training.clients import sampling
from thrift_trainer.training.clients.errors import ClientsError
from thrift_trainer.training.clients.partitioners import PARTITIONERS
from thrift_trainer.training.plugins import is_plugin_name

SECTION = "clients"
MAX_CLIENTS = 1_000_000
NAME_PREFIX = "client"


PLACEMENTS = ("partition", "nodes")
SAMPLINGS = ("fixed", "poisson")


@dataclass(frozen=True)
class ClientsSettings:
    placement: str = "partition"
    count: int = 0
    partition: str = "iid"
    alpha: float = 0.5
    shards_per_client: int = 2
    classes_per_client: int = 2
    size_skew: float = 1.0
    per_round: float = 0.0
    over_select: float = 1.0
    sampling: str = "fixed"
    validation_fraction: float = 0.0
    eval_every: int = 0
    eval_per_round: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.count > 0 or self.on_nodes

    @property
    def on_nodes(self) -> bool:
        """Node-resident clients: each node's own data is its client."""
        return self.placement == "nodes"

    def to_dict(self) -> dict[str, Any]:
        """The settings as a request carries them; the evaluation keys only when they are
        set, so a run without federated evaluation sends what it sent before."""
        data = asdict(self)
        for key in LATER_KEYS:
            if data[key] == getattr(NONE, key):
                del data[key]
        return data

    def evaluates(self, round_index: int, rounds: int) -> bool:
        """Whether round ``round_index`` of ``rounds`` ends with a federated evaluation:
        every ``eval_every`` rounds and after the last."""
        return self.eval_every > 0 and (round_index % self.eval_every == 0
                                        or round_index == rounds)

    def evaluated(self, round_index: int, seed: int, available: list[str]) -> list[str]:
        """The clients whose validation parts score the global model after
        ``round_index``: ``eval_per_round`` of ``available``, a draw of its own."""
        if not available:
            return []
        target = _target(self.eval_per_round, len(available))
        return sampling.sample(round_index, seed, available, target, purpose="evaluate")

    def partition_params(self) -> dict[str, Any]:
        """The parameters of the chosen built-in rule (a plug-in takes none from here)."""
        own = {"dirichlet": ("alpha",), "shards": ("shards_per_client",),
               "classes": ("classes_per_client",), "quantity": ("size_skew",)}
        return {key: getattr(self, key) for key in own.get(self.partition, ())}

    def names(self) -> list[str]:
        return [client_name(k) for k in range(self.count)]

    def per_round_target(self, available: int | None = None) -> int | float:
        """``per_round`` as `sampling.sample` takes it: a count, a fraction, or every
        client (0) of ``available`` (default: ``count``)."""
        return _target(self.per_round, self.count if available is None else available)

    @property
    def poisson(self) -> bool:
        return self.sampling == "poisson"

    def sampled(self, round_index: int, seed: int, available: list[str],
                key: bytes | None = None) -> list[str]:
        """The clients asked in ``round_index`` (1-based) among ``available``, with the
        over-selection; under Poisson sampling each with probability `q`. ``key``: a
        private run's noise key, which its draws are keyed by (sampling.py)."""
        if not available:
            return []
        if self.poisson:
            return sampling.poisson_sample(round_index, seed, available,
                                           self.q(len(available)), key)
        return sampling.sample(round_index, seed, available,
                               self.per_round_target(len(available)), self.over_select,
                               key=key)

    def q(self, available: int) -> float:
        """Poisson sampling's probability: the target count over ``available`` clients."""
        return self.target(available) / available

    def target(self, available: int) -> int:
        """Results a round of ``available`` clients closes at."""
        return sampling.target_count(self.per_round_target(available), available) \
            if available else 0


def _target(per_round: float, available: int) -> int | float:
    """A ``per_round``-like setting as `sampling.sample` takes it: every client (0) of
    ``available``, a count, or a fraction."""
    if per_round == 0:
        return max(1, available)
    return int(per_round) if per_round >= 1 else per_round


NONE = ClientsSettings()
# keys a request carries only when set (federated evaluation came after the others)
EVALUATION_KEYS = ("validation_fraction", "eval_every", "eval_per_round")
LATER_KEYS = ("sampling", *EVALUATION_KEYS)
MAX_VALIDATION_FRACTION = 0.9


def client_name(index: int) -> str:
    return f"{NAME_PREFIX}{index}"


def client_index(name: str, count: int) -> int:
    """The index of ``client<k>``; ConfigError unless it names one of ``count`` clients."""
    index = client_index_of(name)
    if index is None or index >= count:
        raise ConfigError(f"no client {name!r} among {count} clients")
    return index


def client_index_of(name: str) -> int | None:
    """The index ``k`` of a name ``client<k>`` (no leading zeros), or None for another."""
    digits = name[len(NAME_PREFIX):] if name.startswith(NAME_PREFIX) else ""
    return int(digits) if digits.isdigit() and str(int(digits)) == digits else None


def split_clients(config: Mapping[str, Any]) -> tuple[dict[str, Any], ClientsSettings]:
    """A request's config without its ``clients`` key, and the checked settings."""
    rest = {key: value for key, value in config.items() if key != SECTION}
    return rest, settings_from(config.get(SECTION))


def join_clients(config: Mapping[str, Any], settings: ClientsSettings) -> dict[str, Any]:
    """The config a request carries: with the section only when the run has clients."""
    return {**config, SECTION: settings.to_dict()} if settings.enabled else dict(config)


def settings_from(raw: Any) -> ClientsSettings:
    """Checked settings from a ``clients`` mapping; ConfigError names the bad key."""
    if raw is None:
        return NONE
    settings = checked_section(SECTION, raw, NONE)
    _check_ranges(settings)
    return settings


def _check_ranges(settings: ClientsSettings) -> None:
    if settings.placement not in PLACEMENTS:
        raise ConfigError(f"{SECTION}.placement must be one of {', '.join(PLACEMENTS)}, "
                          f"got {settings.placement!r}")
    if settings.on_nodes and settings.count:
        raise ConfigError(f"{SECTION}.count is for placement partition; with placement "
                          f"nodes each node's own data is a client (leave count at 0)")
    if not 0 <= settings.count <= MAX_CLIENTS:
        raise ConfigError(f"{SECTION}.count must be in 0..{MAX_CLIENTS}, got {settings.count}")
    if settings.sampling not in SAMPLINGS:
        raise ConfigError(f"{SECTION}.sampling must be one of {', '.join(SAMPLINGS)}, "
                          f"got {settings.sampling!r}")
    if settings.poisson and settings.over_select != 1:
        raise ConfigError(f"{SECTION}.over_select: Poisson sampling asks each client with "
                          f"its probability; leave over_select at 1")
    if settings.partition not in PARTITIONERS and not is_plugin_name(settings.partition):
        raise ConfigError(f"{SECTION}.partition must be one of {', '.join(PARTITIONERS)} "
                          f"or a plug-in module:function, got {settings.partition!r}")
    for key in ("per_round", "eval_per_round"):
        per_round = getattr(settings, key)
        if not math.isfinite(per_round) or per_round < 0 or (
                per_round >= 1 and per_round != int(per_round)):
            raise ConfigError(f"{SECTION}.{key} must be 0 (every client), a whole count or "
                              f"a fraction in (0, 1), got {per_round}")
    _check_evaluation(settings)
    try:
        sampling.sample(1, 0, ["c"], settings.per_round_target() if settings.enabled else 1,
                        settings.over_select)
    except ClientsError as exc:
        raise ConfigError(f"{SECTION}.{exc}") from None


def _check_evaluation(settings: ClientsSettings) -> None:
    """The held-out share in range; federated evaluation only with validation parts to
    score (a node-resident client may bring its data set's own validation part)."""
    fraction = settings.validation_fraction
    if not (math.isfinite(fraction) and 0 <= fraction <= MAX_VALIDATION_FRACTION):
        raise ConfigError(f"{SECTION}.validation_fraction must be in [0, "
                          f"{MAX_VALIDATION_FRACTION}], got {fraction}")
    if settings.eval_every < 0:
        raise ConfigError(f"{SECTION}.eval_every must be 0 (off) or a number of rounds, "
                          f"got {settings.eval_every}")
    if settings.eval_every and not fraction and not settings.on_nodes:
        raise ConfigError(f"{SECTION}.eval_every needs {SECTION}.validation_fraction > 0: "
                          f"a client's validation part is that share of its examples")
    if (fraction or settings.eval_every) and not settings.enabled:
        raise ConfigError(f"{SECTION}.validation_fraction and {SECTION}.eval_every are for "
                          f"runs with clients (set {SECTION}.count or placement nodes)")
