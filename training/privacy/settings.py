"""A run's ``privacy`` section: client-level differential privacy (docs/privacy.md).

* ``clip``: the L2 norm bound of one client's update (delta) in a round; 0 (the default)
  turns privacy off and the run is exactly what it was without the section.
* ``noise_multiplier``: z; the round's sum of clipped updates gets Gaussian noise of
  standard deviation z x clip.
* ``delta``: the delta at which epsilon is reported.
* ``target_epsilon``: the most epsilon a run may spend; 0: no limit.
* ``accountant``: rdp | pld (dp-accounting's Renyi or privacy-loss-distribution one).
* ``adaptive_clip_quantile``: 0, a fixed clip; else the quantile of the update norms the
  clip follows from ``clip`` (adaptive clipping, adaptive.py), by steps of
  ``clip_learning_rate``, from a count of clients under the clip noised with
  ``clip_count_stddev`` (0: expected clients per round / 20).

The defaults live in training/schema.py (`PrivacySettings`). Like ``clients``, the section
travels inside a request's config only when privacy is on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from thrift_trainer.training.algorithms.config_checks import ConfigError, checked_section
from thrift_trainer.training.schema import PrivacySettings

SECTION = "privacy"
ACCOUNTANTS = ("rdp", "pld")
OFF = PrivacySettings()


def settings_from(raw: Any) -> PrivacySettings:
    """Checked settings from a ``privacy`` mapping; ConfigError names the bad key."""
    if raw is None:
        return OFF
    settings = checked_section(SECTION, raw, OFF)
    _check_ranges(settings)
    return settings


def join_privacy(config: Mapping[str, Any], settings: PrivacySettings) -> dict[str, Any]:
    """The config a request carries: with the section only when it is not the default
    (a half-set one travels, for the coordinator to refuse)."""
    return {**config, SECTION: asdict(settings)} if settings != OFF else dict(config)


def _check_ranges(settings: PrivacySettings) -> None:
    for key in ("clip", "noise_multiplier", "target_epsilon"):
        value = getattr(settings, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{SECTION}.{key} must be a finite number >= 0, got {value}")
    if not 0 <= settings.adaptive_clip_quantile < 1:
        raise ConfigError(f"{SECTION}.adaptive_clip_quantile must be in [0, 1) (0: a fixed "
                          f"clip), got {settings.adaptive_clip_quantile}")
    for key in ("clip_learning_rate", "clip_count_stddev"):
        value = getattr(settings, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{SECTION}.{key} must be a finite number >= 0, got {value}")
    if settings.adaptive and settings.clip_learning_rate == 0:
        raise ConfigError(f"{SECTION}.clip_learning_rate must be above 0 with an adaptive "
                          f"clip")
    if not 0 < settings.delta < 1:
        raise ConfigError(f"{SECTION}.delta must be in (0, 1), got {settings.delta}")
    if settings.accountant not in ACCOUNTANTS:
        raise ConfigError(f"{SECTION}.accountant must be one of {', '.join(ACCOUNTANTS)}, "
                          f"got {settings.accountant!r}")
    if not settings.enabled and settings != OFF:
        raise ConfigError(f"{SECTION}: set {SECTION}.clip > 0 to turn privacy on (the other "
                          f"keys mean nothing without it)")
