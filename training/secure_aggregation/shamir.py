"""Shamir secret sharing (t of n) over the prime field p = 2^521 - 1.

A secret of up to 64 bytes is the constant term of a random polynomial of degree t - 1;
the share at x is the polynomial's value there. Any t shares give the polynomial back
(Lagrange interpolation at 0); t - 1 say nothing of the secret. p is the Mersenne prime
just above 2^512, so any 64-byte secret (a 32-byte seed, a 32-byte private key) is one
field element, and a share is a fixed 66 bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from thrift_trainer.training.secure_aggregation.errors import SecAggError

PRIME = (1 << 521) - 1
SECRET_BYTES = 64  # the longest secret: 512 bits, below p
SHARE_BYTES = 66  # ceil(521 / 8)


def split(secret: bytes, xs: Sequence[int], threshold: int) -> dict[int, int]:
    """The shares of ``secret`` at each of ``xs`` (distinct, 1 <= x < p): x -> y, any
    ``threshold`` of which rebuild it."""
    if len(secret) > SECRET_BYTES:
        raise ValueError(f"a secret has at most {SECRET_BYTES} bytes, not {len(secret)}")
    _check_xs(xs)
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} is not in 1..{len(xs)} (the shares)")
    # coefficients of x^1 .. x^(t-1), uniform in the field, from the system's CSPRNG
    coefficients = [int.from_bytes(secret, "big")]
    coefficients += [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coefficients, x) for x in xs}


def _check_xs(xs: Sequence[int]) -> None:
    if len(set(xs)) != len(xs):
        raise ValueError("share coordinates must be distinct")
    for x in xs:
        if not 1 <= x < PRIME:  # x = 0 would hand out the secret itself
            raise ValueError(f"share coordinate {x} is not in 1..p-1")


def _evaluate(coefficients: list[int], x: int) -> int:
    """The polynomial at x, by Horner's rule, mod p."""
    y = 0
    for coefficient in reversed(coefficients):
        y = (y * x + coefficient) % PRIME
    return y


def combine(shares: Mapping[int, int], length: int) -> bytes:
    """The secret of ``length`` bytes whose polynomial passes through exactly ``shares``
    (Lagrange interpolation at 0). SecAggError when no share is given or the result does
    not fit ``length`` bytes: too few or wrong shares (the chance that they still fit is
    2^(8 length) / p, negligible)."""
    if not shares:
        raise SecAggError("no share to rebuild a secret from")
    _check_xs(list(shares))
    secret = 0
    for x, y in shares.items():
        secret = (secret + y * _lagrange_at_zero(x, shares)) % PRIME
    if secret >> (8 * length):
        raise SecAggError(f"the {len(shares)} shares given do not rebuild a secret")
    return secret.to_bytes(length, "big")


def _lagrange_at_zero(x: int, xs: Mapping[int, int]) -> int:
    """The Lagrange basis polynomial of ``x`` over ``xs``, at 0."""
    numerator, denominator = 1, 1
    for other in xs:
        if other != x:
            numerator = numerator * other % PRIME
            denominator = denominator * (other - x) % PRIME
    return numerator * pow(denominator, -1, PRIME) % PRIME


def share_to_bytes(y: int) -> bytes:
    """A share's value as ``SHARE_BYTES`` big-endian bytes."""
    if not 0 <= y < PRIME:
        raise ValueError("a share is a field element, in 0..p-1")
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    """A share's value from its ``SHARE_BYTES`` bytes; SecAggError when malformed."""
    if len(data) != SHARE_BYTES:
        raise SecAggError(f"a share has {SHARE_BYTES} bytes, not {len(data)}")
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise SecAggError("a share is a field element, in 0..p-1")
    return y
