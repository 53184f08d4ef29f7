"""The byte strings that bind keys and ciphertexts to one run, one round, one purpose and
one pair of clients (the HKDF info and the AES-GCM associated data). Every field is
length-prefixed, so no two different tuples give the same string."""

from __future__ import annotations

import hashlib

SHARES = b"secagg/shares"  # the key that seals secret shares between two clients
MASK = b"secagg/mask"  # the seed of two clients' pairwise mask
SEED = b"secagg/seed"  # a client's commitment to its self-mask seed


def label(purpose: bytes, context: bytes, *names: str) -> bytes:
    """``purpose``, ``context`` and ``names`` as one unambiguous byte string."""
    fields = (purpose, bytes(context), *(name.encode() for name in names))
    return b"".join(len(field).to_bytes(4, "big") + field for field in fields)


def pair_info(purpose: bytes, context: bytes, a: str, b: str) -> bytes:
    """The HKDF info of a key two clients agree on: their names sorted, so both sides
    derive the same key."""
    return label(purpose, context, *sorted((a, b)))


def sealed_for(context: bytes, sender: str, recipient: str) -> bytes:
    """The associated data of the shares ``sender`` seals for ``recipient``: ordered, so
    a ciphertext cannot be passed off as going the other way."""
    return label(SHARES, context, sender, recipient)


def seed_commitment(context: bytes, client: str, seed: bytes) -> bytes:
    """SHA-256 of ``client``'s self-mask seed in this round: sent with its public keys, so
    that the coordinator knows a seed rebuilt from wrong shares for what it is."""
    return hashlib.sha256(label(SEED, context, client) + bytes(seed)).digest()
