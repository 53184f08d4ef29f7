"""Who shares masks and secrets with whom in a round (SecAgg+, Bell et al. 2020).

The round's clients, sorted by name, sit on a ring; each is joined to the k/2 nearest on
either side, so a client's cost grows with k, not with the round's size. k = 0, or k at
least n - 1, joins every pair: the original SecAgg of Bonawitz et al. 2017. The graph is a
function of the names alone, so every client and the coordinator compute the same one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def neighbours(clients: Sequence[str], k: int) -> dict[str, list[str]]:
    """Each client's neighbours (sorted by name): the k/2 nearest on each side of the ring
    of sorted names, k rounded up to even; everyone else when k is 0 or >= n - 1.
    Symmetric; a client is never its own neighbour."""
    ring = _sorted_unique(clients)
    if k < 0:
        raise ValueError(f"k must not be negative, not {k}")
    n, half = len(ring), (k + 1) // 2
    if k == 0 or 2 * half >= n - 1:
        return {name: [other for other in ring if other != name] for name in ring}
    return {name: sorted(ring[(i + step) % n] for step in range(-half, half + 1) if step)
            for i, name in enumerate(ring)}


def _sorted_unique(clients: Sequence[str]) -> list[str]:
    ring = sorted(clients)
    if len(set(ring)) != len(ring):
        raise ValueError("client names must be distinct")
    return ring


def share_threshold(fraction: float, k: int) -> int:
    """The shares that rebuild the secrets of a client with ``k`` neighbours:
    max(1, ceil(fraction x k)). ValueError unless it is more than k / 2: with fewer, a
    coordinator could collect a client's self-mask seed from one half of its neighbours
    and its mask key from the other half, and unmask that client's input alone."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the share fraction must be in (0, 1], not {fraction!r}")
    # rounded first so that 0.7 x 10 = 7.000000000000001 needs 7 shares, not 8
    needed = max(1, math.ceil(round(fraction * k, 9)))
    if not 2 * needed > k:
        raise ValueError(f"{needed} shares of {k} are not a majority: raise the fraction "
                         f"{fraction} above 1/2")
    return needed


def positions(clients: Sequence[str]) -> dict[str, int]:
    """Each client's Shamir x coordinate: its 1-based index in sorted order."""
    return {name: i + 1 for i, name in enumerate(_sorted_unique(clients))}
