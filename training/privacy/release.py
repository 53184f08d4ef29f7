"""DP-FedAvg's coordinator half for one run: each round's noised mean of the clipped
updates (mechanism.py), with the clip in force, which adaptive clipping moves after each
round (adaptive.py). The clip is state: it goes into the checkpoint, so that a resumed run
clips its next round as the uninterrupted one would have."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from thrift_trainer.training.privacy import adaptive, mechanism
from thrift_trainer.training.schema import PrivacySettings
from thrift_trainer.training.units import Weights

CLIP_KEY = "privacy.clip"  # the clip in force in the checkpoint's algorithm state


class PrivateRelease:
    """The run's noised means, round by round; ``clip`` is the one the next round uses and
    ``last_clip`` the one the last round used."""

    def __init__(self, settings: PrivacySettings, seed: int) -> None:
        self.settings, self.seed = settings, seed
        self.clip = settings.clip
        self.last_clip = settings.clip

    def mean(self, updates: Sequence[Mapping[str, np.ndarray]], like: Weights,
             expected_clients: float, round_index: int) -> Weights:
        """The round's noised mean update (its noise z_delta x clip when the clip adapts);
        then, with adaptive clipping, the clip of the next round from the noised count."""
        settings = self.settings
        z = adaptive.update_noise_multiplier(settings, expected_clients)
        mean = mechanism.private_mean(updates, like, self.clip, z, expected_clients,
                                      self.seed, round_index)
        self.last_clip = self.clip
        if settings.adaptive:
            fraction = adaptive.fraction_under(
                [mechanism.global_norm(update) for update in updates], self.clip,
                adaptive.count_stddev(settings, expected_clients), expected_clients,
                self.seed, round_index)
            self.clip = adaptive.next_clip(self.clip, fraction, settings)
        return mean

    def state_dict(self) -> dict[str, Any]:
        """The clip in force, for the checkpoint (nothing with a fixed clip)."""
        return {CLIP_KEY: np.float64(self.clip)} if self.settings.adaptive else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The clip of a checkpoint; ValueError for an adaptive run's state without one."""
        if not self.settings.adaptive:
            return
        if CLIP_KEY not in state:
            raise ValueError(f"the state has no {CLIP_KEY} (the clip adaptive clipping left)")
        self.clip = float(state[CLIP_KEY])
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"{CLIP_KEY} must be a positive number, got {self.clip}")
