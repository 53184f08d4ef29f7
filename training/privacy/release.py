"""DP-FedAvg's coordinator half for one run: each round's noised mean of the clipped
updates (mechanism.py), with the clip in force, which adaptive clipping moves after each
round (adaptive.py). The clip is state: it goes into the checkpoint, so that a resumed run
clips its next round as the uninterrupted one would have; so is the noise key every draw is
keyed by (noise_key.py), which the coordinator gives a private run when it starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from thrift_trainer.training.privacy import adaptive, mechanism, noise_key
from thrift_trainer.training.schema import PrivacySettings
from thrift_trainer.training.units import Weights

CLIP_KEY = "privacy.clip"  # the clip in force in the checkpoint's algorithm state


class PrivateRelease:
    """The run's noised means, round by round; ``clip`` is the one the next round uses and
    ``last_clip`` the one the last round used; ``key`` the run's noise key (None until
    the coordinator gives it one)."""

    def __init__(self, settings: PrivacySettings) -> None:
        self.settings = settings
        self.clip = settings.clip
        self.last_clip = settings.clip
        self.key: bytes | None = None

    def use_key(self, key: bytes) -> None:
        """Key every later draw with ``key`` (32 bytes)."""
        self.key = noise_key.checked(key)

    def checked_key(self) -> bytes:
        """The noise key; RuntimeError when none was given: noise drawn from anything
        public could be taken off again."""
        if self.key is None:
            raise RuntimeError("a private run's noise is keyed by its noise key, which the "
                               "coordinator gives it when the run starts; it has none")
        return self.key

    def mean(self, updates: Sequence[Mapping[str, np.ndarray]], like: Weights,
             expected_clients: float, round_index: int) -> Weights:
        """The round's noised mean update (its noise z_delta x clip when the clip adapts);
        then, with adaptive clipping, the clip of the next round from the noised count."""
        settings, key = self.settings, self.checked_key()
        z = adaptive.update_noise_multiplier(settings, expected_clients)
        mean = mechanism.private_mean(updates, like, self.clip, z, expected_clients,
                                      key, round_index)
        self.last_clip = self.clip
        if settings.adaptive:
            fraction = adaptive.fraction_under(
                [mechanism.global_norm(update) for update in updates], self.clip,
                adaptive.count_stddev(settings, expected_clients), expected_clients,
                key, round_index)
            self.clip = adaptive.next_clip(self.clip, fraction, settings)
        return mean

    def state_dict(self) -> dict[str, Any]:
        """For the checkpoint: a private run's noise key, and the clip in force when it
        adapts (nothing without privacy)."""
        state: dict[str, Any] = {}
        if self.settings.enabled and self.key is not None:
            state[noise_key.STATE_KEY] = noise_key.as_state(self.key)
        if self.settings.adaptive:
            state[CLIP_KEY] = np.float64(self.clip)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The noise key and clip of a checkpoint; ValueError for a private run's state
        without its key (its draws could not go on as they were), or an adaptive run's
        without its clip."""
        if not self.settings.enabled:
            return
        if noise_key.STATE_KEY not in state:
            raise ValueError(f"the state has no {noise_key.STATE_KEY} (the key of the run's "
                             f"noise and client draws)")
        self.key = noise_key.from_state(state[noise_key.STATE_KEY])
        if not self.settings.adaptive:
            return
        if CLIP_KEY not in state:
            raise ValueError(f"the state has no {CLIP_KEY} (the clip adaptive clipping left)")
        self.clip = float(state[CLIP_KEY])
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"{CLIP_KEY} must be a positive number, got {self.clip}")
