"""A private run's noise key: the secret every random draw of its mechanism comes from.

The run's ``seed`` is public (it is in the request and in the config every node gets), so
noise drawn from it could be drawn again by anyone who knows it and taken off the released
model, and clients drawn by it would be known to the requester, whose ignorance of the draw
the sampling's amplification assumes. The coordinator therefore makes 32 random bytes when
a private run starts (`coordinator/run_setup.py`, through the engine's runtime, whose
simulation gives a fixed key so that a simulated run stays reproducible) and keys with
them the Gaussian noise, the adaptive clip's count noise and the client draw. The key
travels nowhere: it is kept in the run's checkpoint (the algorithm's state,
``privacy.noise_key``), so that a resumed run, or a standby taking over, draws what the
run would have drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEY_BYTES = 32
LABEL = "privacy noise key"  # what the runtime is asked for (a simulation's is fixed by it)
STATE_KEY = "privacy.noise_key"  # the key in the checkpoint's algorithm state


class NoiseKeyError(ValueError):
    """A noise key that is not ``KEY_BYTES`` bytes."""


def checked(key: Any) -> bytes:
    """``key`` as bytes; NoiseKeyError unless it is ``KEY_BYTES`` of them."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise NoiseKeyError(f"a noise key is {KEY_BYTES} bytes, got {key!r:.40}")
    return bytes(key)


def generator(tag: int, key: bytes, index: int) -> np.random.Generator:
    """numpy's generator for one stream of the mechanism (``tag``) and one round or
    release (``index``), seeded by the key as eight 32-bit words: all 256 bits count."""
    words = np.frombuffer(checked(key), dtype="<u4").tolist()
    return np.random.default_rng([int(tag), *words, int(index)])


def as_state(key: bytes) -> np.ndarray:
    """The key as the checkpoint keeps it: an array of bytes."""
    return np.frombuffer(checked(key), dtype=np.uint8).copy()


def from_state(value: Any) -> bytes:
    """The key back from the checkpoint's array; NoiseKeyError for a damaged one."""
    array = np.asarray(value)
    if array.dtype != np.uint8 or array.shape != (KEY_BYTES,):
        raise NoiseKeyError(f"{STATE_KEY} must be {KEY_BYTES} bytes, got an array of "
                            f"{array.dtype} {array.shape}")
    return array.tobytes()
