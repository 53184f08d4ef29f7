"""Fixed-point encoding of weighted, clipped float updates into the ring, chosen so that
the sum of a round's encoded updates never wraps around: decoding the ring sum gives the
weighted sum of the clipped updates within ``error_bound``."""

from __future__ import annotations

import numpy as np

from thrift_trainer.training.secure_aggregation.ring import check_bits, reduce


def scale_for(clip_range: float, bits: int, clients: int) -> float:
    """The largest scale at which the rounded sum of ``clients`` terms, each a weight (the
    weights summing to at most 1) times a value in [-clip_range, clip_range], stays inside
    the ring's signed range: (2^(bits-1) - 1 - clients) / clip_range, the ``clients`` term
    absorbing each term's rounding by up to 1/2. ValueError when that is not positive."""
    check_bits(bits)
    if not clip_range > 0:
        raise ValueError(f"clip_range must be positive, not {clip_range!r}")
    if clients < 1:
        raise ValueError(f"clients must be at least 1, not {clients!r}")
    room = (1 << (bits - 1)) - 1 - clients
    if room <= 0:
        raise ValueError(f"{bits} bits are too few for a sum of {clients} clients")
    return room / clip_range


def quantize(values: np.ndarray, weight: float, clip_range: float, scale: float,
             bits: int) -> tuple[np.ndarray, int]:
    """``values`` clipped to [-clip_range, clip_range], times ``weight``, times ``scale``,
    rounded to nearest and mapped to the ring in two's complement; with the number of
    values the clipping changed. Same shape as ``values``."""
    check_bits(bits)
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], not {weight!r}")
    floats = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(floats)):
        raise ValueError("values must be finite")  # NaN has no place in the ring
    clipped = np.clip(floats, -clip_range, clip_range)
    count = int(np.count_nonzero(clipped != floats))
    signed = np.rint(clipped * weight * scale).astype(np.int64)
    return reduce(signed.view(np.uint64), bits), count


def dequantize(ring_values: np.ndarray, scale: float, bits: int) -> np.ndarray:
    """Ring elements read as signed (those >= 2^(bits-1) are negative), divided by
    ``scale``: float64, same shape."""
    check_bits(bits)
    signed = np.asarray(ring_values).astype(np.int64)
    signed[signed >= (1 << (bits - 1))] -= 1 << bits
    return signed / scale


def error_bound(clients: int, scale: float) -> float:
    """The largest absolute error per coordinate of a dequantized sum of ``clients``
    rounded terms, clipping aside: each term is off by at most 1/2 before division by
    ``scale``. float64 rounding (relative 2^-52 of the values) comes on top."""
    return clients * 0.5 / scale
