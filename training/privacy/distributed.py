"""Distributed DP: DP-FedAvg's noise shared out among the clients of a secure round.

With secure aggregation the coordinator never sees one client's update, so it cannot clip
one, and noise it added itself would hide nothing from it. Each client instead clips its
own update to L2 norm ``privacy.clip`` and adds Gaussian noise of standard deviation
z x clip / sqrt(m) to every coordinate, m being ``secure_aggregation.noise_clients``, read
by the node from the run's config (a coordinator cannot lower it round by round). The sum
of m clients' noise has standard deviation z x clip, the noise of central DP-FedAvg, so a
round is accounted as it is there: the coordinator learns no more than the noised sum.

When fewer than m clients' updates reach the sum (dropouts, a small Poisson draw), the
coordinator adds the rest of the noise, z x clip x sqrt(1 - n/m), before anything leaves it:
the released model is as private as epsilon says, but the coordinator itself saw a sum with
less noise (it logs a warning for such a round); that top-up is keyed by the run's secret
noise key (noise_key.py), as central DP's noise is. A client's noise is drawn by numpy's
PCG64 generator seeded with 128 bits from the operating system's generator, so no one can
predict or remove it: unlike central DP, a run is not reproducible bit for bit.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping

import numpy as np

from thrift_trainer.training.privacy.mechanism import clipped
from thrift_trainer.training.schema import PrivacySettings


def client_noise_std(settings: PrivacySettings, noise_clients: int) -> float:
    """The standard deviation of one client's noise on each coordinate."""
    return settings.noise_multiplier * settings.clip / math.sqrt(noise_clients)


def privatized(update: Mapping[str, np.ndarray], settings: PrivacySettings,
               noise_clients: int) -> dict[str, np.ndarray]:
    """A client's update clipped to ``settings.clip`` (all tensors as one vector), plus its
    share of the noise (float64)."""
    std = client_noise_std(settings, noise_clients)
    generator = np.random.default_rng(secrets.randbits(128))
    return {name: value + generator.normal(0.0, std, size=value.shape) if std > 0 else value
            for name, value in clipped(update, settings.clip).items()}


def shortfall_std(settings: PrivacySettings, noise_clients: int, contributed: int) -> float:
    """The noise the coordinator adds to a sum of ``contributed`` clients' updates so that
    it carries z x clip in all (0 when at least ``noise_clients`` contributed)."""
    missing = max(0.0, 1.0 - contributed / noise_clients)
    return settings.noise_multiplier * settings.clip * math.sqrt(missing)
