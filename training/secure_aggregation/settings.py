"""A run's ``secure_aggregation`` section (docs/privacy.md, "Secure aggregation").

* ``enabled``: each sync round of delta_avg with clients runs the SecAgg+ phases, and the
  coordinator learns only the sum of the round's client updates.
* ``bits``: the ring Z_(2^bits) the quantised, masked updates live in (8..62; 32 sends
  4 bytes a parameter).
* ``neighbours``: each client's neighbours in the round's graph, with whom it shares masks
  and its secrets' shares (SecAgg+); 0: every other client of the round (SecAgg).
* ``threshold``: the share of a client's neighbours whose shares rebuild its secrets
  (above 0.5); the round's sum is recovered while, for every client, at least that many of
  its neighbours stay to the end.
* ``clip_range``: each coordinate of a client's update is clipped to [-clip_range,
  clip_range] before it is quantised (with privacy on: the privacy clip, on the update's L2
  norm, comes first).
* ``noise_clients``: with privacy on, m: each client adds noise of z x clip / sqrt(m), so
  the sum of m clients' updates carries the noise of central DP-FedAvg
  (training/privacy/distributed.py); required then, meaningless otherwise.

The defaults live in training/schema.py (`SecureAggregationSettings`). The section travels
inside a request's config only when it is on: nodes read it there, so a coordinator cannot
lower a run's threshold or bits round by round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from thrift_trainer.training.algorithms.config_checks import ConfigError, checked_section
from thrift_trainer.training.schema import SecureAggregationSettings

SECTION = "secure_aggregation"
OFF = SecureAggregationSettings()
MIN_BITS, MAX_BITS = 8, 62


def settings_from(raw: Any) -> SecureAggregationSettings:
    """Checked settings from a ``secure_aggregation`` mapping; ConfigError names the bad
    key."""
    if raw is None:
        return OFF
    settings = checked_section(SECTION, raw, OFF)
    _check_ranges(settings)
    return settings


def join_secure_aggregation(config: Mapping[str, Any],
                            settings: SecureAggregationSettings) -> dict[str, Any]:
    """The config a request carries: with the section only when it is not the default."""
    return {**config, SECTION: asdict(settings)} if settings != OFF else dict(config)


def _check_ranges(settings: SecureAggregationSettings) -> None:
    if not MIN_BITS <= settings.bits <= MAX_BITS:
        raise ConfigError(f"{SECTION}.bits must be in {MIN_BITS}..{MAX_BITS}, "
                          f"got {settings.bits}")
    if settings.neighbours < 0:
        raise ConfigError(f"{SECTION}.neighbours must be >= 0 (0: every other client), "
                          f"got {settings.neighbours}")
    if not 0.5 < settings.threshold <= 1:
        raise ConfigError(f"{SECTION}.threshold must be in (0.5, 1] (a share of a client's "
                          f"neighbours), got {settings.threshold}")
    if not (math.isfinite(settings.clip_range) and settings.clip_range > 0):
        raise ConfigError(f"{SECTION}.clip_range must be a finite number > 0, "
                          f"got {settings.clip_range}")
    if settings.noise_clients < 0:
        raise ConfigError(f"{SECTION}.noise_clients must be >= 0, got "
                          f"{settings.noise_clients}")
    if not settings.enabled and settings != OFF:
        raise ConfigError(f"{SECTION}: set {SECTION}.enabled: true to turn it on (the other "
                          f"keys mean nothing without it)")
