"""The ring Z_(2^bits) that masked inputs live in: unsigned numpy arrays, arithmetic mod
2^bits. Masks and quantized values are added here, so a masked input is uniform in the
ring whatever the value under it."""

from __future__ import annotations

import numpy as np

# Allowed ring sizes, inclusive: 8 bits at least (anything smaller holds no update), 62 at
# most, so a signed sum still fits an int64 with room for the sign.
RING_BITS: tuple[int, int] = (8, 62)


def check_bits(bits: int) -> int:
    """``bits`` itself, or ValueError outside ``RING_BITS``."""
    low, high = RING_BITS
    if not isinstance(bits, (int, np.integer)) or not low <= bits <= high:
        raise ValueError(f"ring bits must be an integer in {low}..{high}, not {bits!r}")
    return int(bits)


def ring_dtype(bits: int) -> np.dtype:
    """The unsigned dtype of the ring: uint32 up to 32 bits, else uint64."""
    return np.dtype(np.uint32) if check_bits(bits) <= 32 else np.dtype(np.uint64)


def ring_mask(bits: int) -> int:
    """2^bits - 1: the bits a ring element may have set."""
    return (1 << check_bits(bits)) - 1


def reduce(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (unsigned) in the ring's dtype, reduced mod 2^bits."""
    dtype = ring_dtype(bits)
    out = np.asarray(values).astype(dtype, copy=False)
    if bits == dtype.itemsize * 8:  # the dtype's own wrap-around is the ring's
        return out
    return out & dtype.type(ring_mask(bits))


def add(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a + b mod 2^bits."""
    dtype = ring_dtype(bits)
    return reduce(np.add(np.asarray(a, dtype), np.asarray(b, dtype)), bits)


def sub(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a - b mod 2^bits."""
    dtype = ring_dtype(bits)
    return reduce(np.subtract(np.asarray(a, dtype), np.asarray(b, dtype)), bits)
