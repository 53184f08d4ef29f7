"""One client's half of a secure-aggregation round (Bonawitz et al. 2017 with the sparse
graph of SecAgg+), kept on the node between the round's phases:

1. ``public_keys``: two fresh X25519 public keys, c (sealing shares) and s (pair masks).
2. ``share_keys``: given the keys of every client that advertised them (U1), the shares of
   this client's self-mask seed b and of its s private key, one pair per neighbour, each
   sealed for that neighbour alone.
3. ``mask``: given who sent shares (U2), the quantized update plus PRG(b) plus, per
   neighbour v in U2, +PRG(s_uv) if this client's name sorts first, else -PRG(s_uv). The
   pair masks cancel in the sum; PRG(b) hides the input even if a pair key is revealed.
4. ``unmask``: given whose masked input arrived (U3), per neighbour that sent shares, its
   b-share if it is in U3, else its s-key share: never both for one client, and once.

Each phase runs once and in this order; anything else raises SecAggError, and a failed
phase ends the client's round (nothing it held can be asked for again).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping

import numpy as np

from thrift_trainer.training.secure_aggregation import keys as keymod
from thrift_trainer.training.secure_aggregation import labels, prg, ring, shamir
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.graph import (
    neighbours,
    positions,
    share_threshold,
)
from thrift_trainer.training.secure_aggregation.quantize import quantize

_PHASES = ("share_keys", "mask", "unmask", "done")
KeyTable = Mapping[str, tuple[bytes, bytes]]


class SecAggClient:
    """The secrets of client ``client`` for one round, bound to ``context`` (the run and
    the round: every derived key and every sealed message carries it)."""

    def __init__(self, context: bytes, client: str) -> None:
        if not client:
            raise ValueError("a client needs a name")
        self.context, self.client = bytes(context), client
        self._c_key, self._s_key = keymod.generate(), keymod.generate()
        self._b_seed = secrets.token_bytes(prg.SEED_BYTES)
        self._next = "share_keys"
        self._keys: dict[str, tuple[bytes, bytes]] = {}
        self._u1: frozenset[str] = frozenset()
        self._neighbours: list[str] = []
        self._threshold = 0
        self._u2: frozenset[str] = frozenset()

    def public_keys(self) -> tuple[bytes, bytes]:
        """(c_pk, s_pk), raw 32 bytes each: what the client advertises (U1)."""
        return keymod.public_bytes(self._c_key), keymod.public_bytes(self._s_key)

    def seed_commitment(self) -> bytes:
        """The commitment to the self-mask seed b, advertised with the keys: the
        coordinator checks the b it rebuilds against it (a wrong share cannot pass)."""
        return labels.seed_commitment(self.context, self.client, self._b_seed)

    def _enter(self, phase: str) -> None:
        """Moves on to the phase after ``phase``, or refuses when ``phase`` is not next;
        a phase is spent on entry, so even a failed one cannot be retried."""
        if self._next != phase:
            raise SecAggError(f"client {self.client}: {phase} called when {self._next} "
                              f"was expected")
        self._next = _PHASES[_PHASES.index(phase) + 1]

    def share_keys(self, keys: KeyTable, k: int, threshold: float,
                   u1: Collection[str] | None = None) -> dict[str, bytes]:
        """Per neighbour in the graph over U1 (``keys``, this client included): the
        sealed pair (b-share, s-key share), t = share_threshold(threshold, neighbours)
        of which rebuild each secret. ``u1``: the names of U1, when ``keys`` holds only
        this client's and its neighbours' (SecAgg+: a client needs no other keys)."""
        self._enter("share_keys")
        self._keys = _checked_keys(keys, self.client)
        if self._keys[self.client] != self.public_keys():
            raise SecAggError(f"client {self.client}: the keys listed for it are not its own")
        self._u1 = frozenset(self._keys if u1 is None else u1)
        _check_subset(self._keys, self._u1, "the keys", "U1", self.client)
        self._neighbours = neighbours(sorted(self._u1), k)[self.client]
        if not self._neighbours:
            raise SecAggError(f"client {self.client}: a round needs at least two clients")
        missing = [v for v in self._neighbours if v not in self._keys]
        if missing:
            raise SecAggError(f"client {self.client}: no keys for its neighbour {missing[0]}")
        self._threshold = share_threshold(threshold, len(self._neighbours))
        at = positions(sorted(self._u1))
        xs = [at[v] for v in self._neighbours]
        b_shares = shamir.split(self._b_seed, xs, self._threshold)
        s_shares = shamir.split(keymod.private_bytes(self._s_key), xs, self._threshold)
        return {v: self._seal_for(v, b_shares[at[v]], s_shares[at[v]])
                for v in self._neighbours}

    def _seal_for(self, v: str, b_share: int, s_share: int) -> bytes:
        key = keymod.agree(self._c_key, self._keys[v][0],
                           labels.pair_info(labels.SHARES, self.context, self.client, v))
        plaintext = shamir.share_to_bytes(b_share) + shamir.share_to_bytes(s_share)
        return keymod.seal(key, plaintext, labels.sealed_for(self.context, self.client, v))

    def mask(self, values: np.ndarray, weight: float, u2: Collection[str],
             clip_range: float, scale: float, bits: int) -> tuple[np.ndarray, int]:
        """The masked input (flat, ``values.size`` ring elements) and how many values the
        clipping changed. U2: the clients that sent shares; this client must be one, and
        at least t of its neighbours too, or its self-mask could never be removed."""
        self._enter("mask")
        self._u2 = frozenset(u2)
        _check_subset(self._u2, self._u1, "U2", "U1", self.client)
        live = [v for v in self._neighbours if v in self._u2]
        if len(live) < self._threshold:
            raise SecAggError(f"client {self.client}: {len(live)} of its neighbours sent "
                              f"shares, fewer than the {self._threshold} needed")
        masked, clipped = quantize(np.ravel(values), weight, clip_range, scale, bits)
        masked = ring.add(masked, prg.expand(self._b_seed, masked.size, bits), bits)
        for v in live:
            pair = prg.expand(self._pair_seed(v), masked.size, bits)
            masked = (ring.add if self.client < v else ring.sub)(masked, pair, bits)
        return masked, clipped

    def _pair_seed(self, v: str) -> bytes:
        return keymod.agree(self._s_key, self._keys[v][1],
                            labels.pair_info(labels.MASK, self.context, self.client, v))

    def unmask(self, sealed: Mapping[str, bytes],
               u3: Collection[str]) -> dict[str, tuple[str, bytes]]:
        """Per sender of ``sealed`` (the shares it addressed to this client): ("b",
        b-share) if the sender is in U3 (its masked input arrived), else ("s", s-key
        share). Refused when this client is not in U3, when fewer than t of its
        neighbours are (too small a sum to reveal anything for), or when a ciphertext
        does not open."""
        self._enter("unmask")
        live = frozenset(u3)
        _check_subset(live, self._u2, "U3", "U2", self.client)
        alive = sum(v in live for v in self._neighbours)
        if alive < self._threshold:
            raise SecAggError(f"client {self.client}: {alive} of its neighbours are in U3, "
                              f"fewer than the {self._threshold} needed")
        return {sender: self._reveal(sender, ciphertext, sender in live)
                for sender, ciphertext in sealed.items()}

    def _reveal(self, sender: str, ciphertext: bytes, in_u3: bool) -> tuple[str, bytes]:
        if sender not in self._neighbours or sender not in self._u2:
            raise SecAggError(f"client {self.client}: shares from {sender}, which is not "
                              f"a neighbour in U2")
        key = keymod.agree(self._c_key, self._keys[sender][0],
                           labels.pair_info(labels.SHARES, self.context, self.client, sender))
        plaintext = keymod.open_sealed(key, ciphertext,
                                       labels.sealed_for(self.context, sender, self.client))
        if len(plaintext) != 2 * shamir.SHARE_BYTES:
            raise SecAggError(f"client {self.client}: malformed shares from {sender}")
        b_share, s_share = plaintext[:shamir.SHARE_BYTES], plaintext[shamir.SHARE_BYTES:]
        return ("b", b_share) if in_u3 else ("s", s_share)


def _checked_keys(keys: KeyTable, client: str) -> dict[str, tuple[bytes, bytes]]:
    """``keys`` as a dict of (c_pk, s_pk) byte pairs; SecAggError when one is malformed
    or ``client`` is missing."""
    table = {name: (bytes(pair[0]), bytes(pair[1])) for name, pair in keys.items()}
    for name, (c_pk, s_pk) in table.items():
        if not (keymod.valid_public(c_pk) and keymod.valid_public(s_pk)):
            raise SecAggError(f"client {name}: malformed public keys")
    if client not in table:
        raise SecAggError(f"client {client}: missing from the round's keys (U1)")
    return table


def _check_subset(inner: Collection[str], outer: Collection[str], inner_name: str,
                  outer_name: str, client: str) -> None:
    """SecAggError unless ``client`` is in ``inner`` and ``inner`` within ``outer``."""
    if client not in inner:
        raise SecAggError(f"client {client}: not in {inner_name}")
    stray = sorted(set(inner) - set(outer))
    if stray:
        raise SecAggError(f"client {client}: {inner_name} names {', '.join(stray)}, "
                          f"not in {outer_name}")
