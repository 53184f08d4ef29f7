"""The coordinator's half of a secure-aggregation round: from the masked inputs of U3 and
the shares their senders' neighbours revealed, the sum of U3's quantized updates.

Pair masks between two clients of U3 cancel in the sum by themselves. What is left is
removed here: each U3 client's self-mask PRG(b_u), b_u rebuilt from its b-shares, and the
pair masks that U3 clients added for neighbours in U2 whose input never arrived (U2 - U3),
from those clients' s private keys rebuilt from their s-shares.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from thrift_trainer.training.secure_aggregation import keys as keymod
from thrift_trainer.training.secure_aggregation import labels, prg, ring, shamir
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.graph import (
    neighbours,
    positions,
    share_threshold,
)

Revealed = Mapping[str, Mapping[str, tuple[str, bytes]]]


def unmask_sum(masked: Sequence[np.ndarray], keys: Mapping[str, tuple[bytes, bytes]],
               u2: Collection[str], u3: Collection[str], revealed: Revealed, k: int,
               threshold: float, context: bytes, bits: int,
               commitments: Mapping[str, bytes] | None = None) -> np.ndarray:
    """The sum mod 2^bits of U3's quantized inputs (flat; ``quantize.dequantize`` reads it).

    ``masked``: U3's masked inputs, or any partial sums of them (a running sum as one
    array), which are added up here; leaving one out gives noise, not an error.
    ``keys``: U1's (c_pk, s_pk); ``revealed``: revealer -> owner -> (kind, share) from
    ``SecAggClient.unmask``. SecAggError names the client when fewer than its threshold of
    shares came back, when a revealer sent the wrong kind, or when the sets contradict
    each other (U3 within U2 within U1). ``commitments``: U3's commitments to their
    self-mask seeds (`SecAggClient.seed_commitment`), against which each rebuilt seed is
    checked, so that a wrong share fails the round instead of spoiling its sum."""
    total = _summed(masked, bits)
    live, sent = frozenset(u3), frozenset(u2)
    _check_sets(keys, sent, live)
    graph = neighbours(sorted(keys), k)
    shares = _collect(revealed, graph, sent, live, positions(sorted(keys)))
    for owner in sorted(live):
        seed = _rebuild(owner, shares, graph, threshold, prg.SEED_BYTES)
        if commitments is not None and labels.seed_commitment(context, owner, seed) \
                != commitments.get(owner):
            raise SecAggError(f"client {owner}: its rebuilt self-mask seed is not the one "
                              f"it committed to (a wrong share)")
        total = ring.sub(total, prg.expand(seed, total.size, bits), bits)
    for owner in sorted(sent - live):
        total = _remove_pairs(total, owner, shares, graph, keys, live, threshold, context, bits)
    return total


def _summed(masked: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """The ring sum of ``masked``; SecAggError when there is none or sizes differ."""
    arrays = [np.ravel(array) for array in masked]
    if not arrays or len({array.size for array in arrays}) != 1:
        raise SecAggError("masked inputs: none given, or of different sizes")
    total = ring.reduce(arrays[0], bits)
    for array in arrays[1:]:
        total = ring.add(total, array, bits)
    return total


def _check_sets(keys: Mapping[str, tuple[bytes, bytes]], u2: frozenset[str],
                u3: frozenset[str]) -> None:
    if not u3:
        raise SecAggError("U3 is empty: no masked input to sum")
    for inner, outer, names in ((u2, keys, "U2 within U1"), (u3, u2, "U3 within U2")):
        stray = sorted(set(inner) - set(outer))
        if stray:
            raise SecAggError(f"clients {', '.join(stray)}: not {names}")


def _collect(revealed: Revealed, graph: Mapping[str, list[str]], u2: frozenset[str],
             u3: frozenset[str], at: Mapping[str, int]) -> dict[str, dict[int, int]]:
    """owner -> {revealer's x: share}, each checked: the revealer is in U3 and a
    neighbour of the owner, and the kind is the one the owner's fate calls for."""
    shares: dict[str, dict[int, int]] = {}
    for revealer, answers in revealed.items():
        if revealer not in u3:
            raise SecAggError(f"client {revealer}: revealed shares but is not in U3")
        for owner, (kind, data) in answers.items():
            if owner not in u2 or owner not in graph[revealer]:
                raise SecAggError(f"client {revealer}: revealed a share of {owner}, "
                                  f"not a neighbour in U2")
            expected = "b" if owner in u3 else "s"
            if kind != expected:
                raise SecAggError(f"client {revealer}: revealed a {kind!r} share of "
                                  f"{owner}, which needs {expected!r}")
            shares.setdefault(owner, {})[at[revealer]] = shamir.share_from_bytes(data)
    return shares


def _rebuild(owner: str, shares: Mapping[str, Mapping[int, int]],
             graph: Mapping[str, list[str]], threshold: float, length: int) -> bytes:
    """``owner``'s secret from the first t of its shares (by x); SecAggError naming it
    when fewer came back."""
    needed = share_threshold(threshold, len(graph[owner]))
    got = shares.get(owner, {})
    if len(got) < needed:
        raise SecAggError(f"client {owner}: {len(got)} shares of its secret came back, "
                          f"fewer than the {needed} needed")
    chosen = {x: got[x] for x in sorted(got)[:needed]}
    try:
        return shamir.combine(chosen, length)
    except SecAggError as error:
        raise SecAggError(f"client {owner}: {error}") from None


def _remove_pairs(total: np.ndarray, owner: str, shares: Mapping[str, Mapping[int, int]],
                  graph: Mapping[str, list[str]], keys: Mapping[str, tuple[bytes, bytes]],
                  u3: frozenset[str], threshold: float, context: bytes,
                  bits: int) -> np.ndarray:
    """``total`` without the pair masks U3 clients added for ``owner`` (in U2, not U3):
    v added +PRG(s_v,owner) when v's name sorts first, else -PRG, so that is undone."""
    s_key = keymod.private_from_bytes(_rebuild(owner, shares, graph, threshold,
                                               keymod.KEY_BYTES))
    if keymod.public_bytes(s_key) != bytes(keys[owner][1]):
        raise SecAggError(f"client {owner}: its rebuilt mask key is not the one it "
                          f"advertised (a wrong share)")
    for v in graph[owner]:
        if v in u3:
            seed = keymod.agree(s_key, keys[v][1],
                                labels.pair_info(labels.MASK, context, owner, v))
            pair = prg.expand(seed, total.size, bits)
            total = (ring.sub if v < owner else ring.add)(total, pair, bits)
    return total
