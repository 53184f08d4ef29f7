"""Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive
Clipping"): the clip follows a chosen quantile of the clients' update norms instead of
staying where it was set.

Each round, besides the noised sum of clipped updates, the coordinator releases a noised
count of the clients whose update was within the clip: the sum of b_i - 1/2 (b_i is 1 when
client i's norm is at most the clip), which one client changes by at most 1/2, plus Gaussian
noise of standard deviation sigma_b. Its estimate of the fraction under the clip,
b = noised sum / expected clients + 1/2, moves the clip geometrically towards the target
quantile gamma: clip <- clip x exp(-eta x (b - gamma)).

The two releases are one Gaussian mechanism: noise z_delta x clip on the updates (sensitivity
clip) and sigma_b on the count (sensitivity 1/2) together spend what noise z alone spends on
the updates when z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 (under replace-one both
sensitivities double, and the pair is one Gaussian of z / 2, as a fixed-clip round is). So
the accounting is that of z (`privacy.noise_multiplier`), and the updates get the larger
z_delta; there is no such z_delta when 2 sigma_b <= z, which is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.privacy import noise_key
from thrift_trainer.training.schema import PrivacySettings

COUNT_TAG = 0x44504351  # the count's noise: apart from the updates' (mechanism.NOISE_TAG)
STDDEV_PER_CLIENT = 1 / 20  # the paper's sigma_b: the expected clients of a round / 20


def count_stddev(settings: PrivacySettings, expected_clients: float) -> float:
    """sigma_b: ``privacy.clip_count_stddev``, or by default expected clients / 20."""
    return settings.clip_count_stddev or expected_clients * STDDEV_PER_CLIENT


def update_noise_multiplier(settings: PrivacySettings, expected_clients: float) -> float:
    """The noise multiplier the updates get: z itself with a fixed clip, z_delta with an
    adaptive one; ConfigError when z_delta is undefined (2 sigma_b <= z)."""
    z = settings.noise_multiplier
    if not settings.adaptive or z == 0:
        return z
    sigma_b = count_stddev(settings, expected_clients)
    rest = z ** -2 - (2 * sigma_b) ** -2
    if rest <= 0:
        raise ConfigError(
            f"privacy.adaptive_clip_quantile: the count's noise sigma_b {sigma_b:.4g} is too "
            f"small for noise_multiplier {z:g} (z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 needs "
            f"2 sigma_b > z); raise privacy.clip_count_stddev above {z / 2:.4g}, or expect "
            f"more clients a round")
    return rest ** -0.5


def fraction_under(norms: Sequence[float], clip: float, sigma_b: float,
                   expected_clients: float, key: bytes, round_index: int) -> float:
    """The noised estimate of the fraction of a round's clients whose update norm is at
    most ``clip`` (the count's noise keyed by (noise key, round), as the updates' is)."""
    centred = sum((1.0 if norm <= clip else 0.0) - 0.5 for norm in norms)
    generator = noise_key.generator(COUNT_TAG, key, round_index)
    return (centred + float(generator.normal(0.0, sigma_b))) / expected_clients + 0.5


def next_clip(clip: float, fraction: float, settings: PrivacySettings) -> float:
    """The geometric update: down when more than the target quantile were under the clip,
    up when fewer."""
    return clip * math.exp(-settings.clip_learning_rate
                           * (fraction - settings.adaptive_clip_quantile))
