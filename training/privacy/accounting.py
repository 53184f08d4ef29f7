"""Epsilon spent by a run's rounds, with Google's dp-accounting package (an optional extra:
pip install '.[privacy]').

Each round is one sampled Gaussian mechanism of noise multiplier z: fixed-size sampling
(``clients.sampling: fixed``, per_round of count clients without replacement) is a
`SampledWithoutReplacementDpEvent`, accounted under replace-one neighbouring (one client's
data replaced, which moves the sum of clipped updates by up to twice the clip, so the
Gaussian's multiplier is z / 2) by the RDP accountant; Poisson sampling (each client with
probability q) is a `PoissonSampledDpEvent`, under add-or-remove-one, by either accountant.
The rounds compose: epsilon after r rounds is the accountant's over the r-fold composition
at ``delta``. The PLD accountant has no fixed-size sampling: that pairing is refused.

A ``buffered`` run (FedBuff) releases one noised buffer per round, whose clients are those
that finished first: no uniform sample, so no amplification by sampling is claimed. Each
release is a plain Gaussian mechanism under replace-one, `GaussianDpEvent(z / 2)`, by the
RDP accountant, composed over the releases.

With adaptive clipping (adaptive.py) the round releases the updates' sum and a count of the
clients under the clip; noised as adaptive.py calibrates them, the two are together one
Gaussian mechanism of noise multiplier z, so a round is accounted as above, with z.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.privacy import adaptive
from thrift_trainer.training.schema import PrivacySettings

INSTALL = "pip install '.[privacy]'"
FIXED, POISSON, BUFFERED = "fixed", "poisson", "buffered"
REPLACE_SENSITIVITY = 2  # the sum's sensitivity under replace-one, in clips


class AccountingUnavailable(ConfigError):
    """dp-accounting is not installed."""


def _library() -> Any:
    try:
        import dp_accounting
        from dp_accounting import pld, rdp  # noqa: F401  (submodules the accountants live in)
    except ImportError:
        raise AccountingUnavailable(
            f"privacy: accounting needs the dp-accounting package, which is not installed "
            f"here; {INSTALL}") from None
    return dp_accounting


@dataclass(frozen=True)
class Sampling:
    """How a round's clients are drawn: ``kind`` fixed (``per_round`` of ``count``),
    poisson (each with probability per_round / count) or buffered (the ``per_round``
    clients of a FedBuff buffer, whoever finished first: no sampling)."""

    kind: str
    count: int
    per_round: int

    @property
    def q(self) -> float:
        return self.per_round / self.count

    @property
    def expected(self) -> float:
        """Clients a round has on average: the divisor of the unbiased mean."""
        return self.q * self.count if self.kind == POISSON else float(self.per_round)


def round_event(settings: PrivacySettings, sampling: Sampling) -> Any:
    """One round as a dp-accounting event."""
    dp = _library()
    z = settings.noise_multiplier
    if sampling.kind == POISSON:  # adding or removing a client moves the sum by <= clip
        return dp.PoissonSampledDpEvent(sampling.q, dp.GaussianDpEvent(z))
    # replacing a client's update moves the sum by up to 2 x clip: dp-accounting takes the
    # multiplier relative to that sensitivity, so z x clip of noise is z / 2 of it
    if sampling.kind == BUFFERED:  # whoever finished first: no amplification claimed
        return dp.GaussianDpEvent(z / REPLACE_SENSITIVITY)
    return dp.SampledWithoutReplacementDpEvent(sampling.count, sampling.per_round,
                                               dp.GaussianDpEvent(z / REPLACE_SENSITIVITY))


def accountant(settings: PrivacySettings, sampling: Sampling) -> Any:
    """A fresh accountant of the run's kind; ConfigError for a pairing it cannot account."""
    return _accountant(settings, sampling.kind)


def check_accountable(settings: PrivacySettings, kind: str) -> None:
    """ConfigError when runs sampling clients by ``kind`` cannot be accounted (no
    dp-accounting, PLD with fixed sampling): what is known before the clients are."""
    _accountant(settings, kind)


def _accountant(settings: PrivacySettings, kind: str) -> Any:
    dp = _library()
    if settings.accountant == "pld":
        if kind == BUFFERED:
            raise ConfigError("privacy.accountant pld is for Poisson-sampled sync rounds; a "
                              "buffered run is accounted by rdp")
        if kind == FIXED:
            raise ConfigError("privacy.accountant pld accounts Poisson sampling only; use "
                              "clients.sampling poisson, or accountant rdp")
        return dp.pld.PLDAccountant()
    relation = dp.NeighboringRelation.ADD_OR_REMOVE_ONE if kind == POISSON \
        else dp.NeighboringRelation.REPLACE_ONE
    return dp.rdp.RdpAccountant(neighboring_relation=relation)


def epsilon(settings: PrivacySettings, sampling: Sampling, rounds: int) -> float:
    """Epsilon at ``settings.delta`` after ``rounds`` noised rounds (0 after none)."""
    return _epsilon(settings, sampling, rounds)


@functools.lru_cache(maxsize=256)
def _epsilon(settings: PrivacySettings, sampling: Sampling, rounds: int) -> float:
    if rounds <= 0:
        return 0.0
    if settings.noise_multiplier == 0:
        return float("inf")
    dp = _library()
    spent = accountant(settings, sampling)
    spent.compose(dp.SelfComposedDpEvent(round_event(settings, sampling), rounds))
    return float(spent.get_epsilon(settings.delta))


def rounds_within(settings: PrivacySettings, sampling: Sampling, most: int) -> int:
    """How many rounds (at most ``most``) keep epsilon within ``settings.target_epsilon``:
    epsilon grows with the rounds, so a binary search."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if epsilon(settings, sampling, middle) <= settings.target_epsilon:
            low = middle
        else:
            high = middle - 1
    return low


def check_plan(settings: PrivacySettings, sampling: Sampling, rounds: int) -> None:
    """ConfigError when ``rounds`` rounds would spend more than ``target_epsilon``, saying
    how many fit; a pairing that cannot be accounted, no dp-accounting, or an adaptive clip
    whose count's noise leaves no z_delta (adaptive.py), is refused too."""
    accountant(settings, sampling)
    adaptive.update_noise_multiplier(settings, sampling.expected)
    if not settings.target_epsilon:
        return
    spent = epsilon(settings, sampling, rounds)
    if spent > settings.target_epsilon:
        fit = rounds_within(settings, sampling, rounds)
        raise ConfigError(f"privacy.target_epsilon: {rounds} rounds would spend epsilon "
                          f"{spent:.4g} > {settings.target_epsilon:g} at delta "
                          f"{settings.delta:g}; {fit} rounds fit")
