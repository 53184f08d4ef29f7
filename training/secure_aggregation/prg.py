"""The pseudo-random generator that expands a 32-byte seed into a mask: the ChaCha20
keystream under that seed. ChaCha20 is a stream cipher built for software speed, with no
table lookups (no timing leak) and a 256-bit key; every mask of a round has its own key, so
one fixed nonce is safe."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.ring import reduce, ring_dtype

SEED_BYTES = 32
# cryptography's ChaCha20 nonce: a 4-byte block counter then a 12-byte nonce, all zero
NONCE = bytes(16)


def expand(seed: bytes, count: int, bits: int) -> np.ndarray:
    """``count`` ring elements from the keystream of ``seed`` (little-endian words of the
    ring's dtype, masked to ``bits``): the same seed always gives the same mask."""
    if len(seed) != SEED_BYTES:
        raise SecAggError(f"a mask seed has {SEED_BYTES} bytes, not {len(seed)}")
    if count < 0:
        raise ValueError(f"count must not be negative, not {count}")
    dtype = ring_dtype(bits)
    encryptor = Cipher(algorithms.ChaCha20(bytes(seed), NONCE), mode=None).encryptor()
    # the keystream is the encryption of zeros, written straight into the array's buffer
    words = np.empty(count, dtype=dtype.newbyteorder("<"))
    encryptor.update_into(np.zeros(words.nbytes, np.uint8), words.view(np.uint8))
    return reduce(words, bits)
