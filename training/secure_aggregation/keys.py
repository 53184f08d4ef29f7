"""Key agreement and authenticated encryption between two clients of a round.

X25519 gives two clients the same shared secret from one's private key and the other's
public key; HKDF-SHA256 turns it into a 32-byte key bound to ``info`` (the run, the round,
the purpose and both names), so the same key pairs never yield the same key in two
contexts. AES-GCM seals what one client sends another through the coordinator: the
coordinator routes ciphertexts it cannot read or alter undetected.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from thrift_trainer.training.secure_aggregation.errors import SecAggError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


def generate() -> X25519PrivateKey:
    """A fresh X25519 private key."""
    return X25519PrivateKey.generate()


def public_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of ``private_key``."""
    return private_key.public_key().public_bytes_raw()


def private_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of ``private_key`` (what is secret-shared)."""
    return private_key.private_bytes_raw()


def private_from_bytes(data: bytes) -> X25519PrivateKey:
    """The private key whose raw bytes are ``data``; SecAggError when malformed."""
    try:
        return X25519PrivateKey.from_private_bytes(bytes(data))
    except ValueError as error:
        raise SecAggError(f"not an X25519 private key: {error}") from None


def agree(private_key: X25519PrivateKey, peer_public: bytes, info: bytes) -> bytes:
    """The 32-byte key this private key and the peer's raw public key agree on, under
    ``info``. SecAggError for a malformed or low-order public key."""
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as error:
        raise SecAggError(f"no key agreement with that public key: {error}") from None
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """``plaintext`` encrypted and authenticated under ``key`` with ``associated`` data:
    a random 12-byte nonce, then the AES-GCM ciphertext and tag."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def open_sealed(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    """The plaintext of ``seal``'s output; SecAggError when the key, the associated data
    or any byte of the ciphertext is not what was sealed."""
    if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        raise SecAggError("a sealed message is too short")
    nonce, body = ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:]
    try:
        return AESGCM(key).decrypt(nonce, body, associated)
    except InvalidTag:
        raise SecAggError("a sealed message does not open: wrong key or altered") from None


def valid_public(data: bytes) -> bool:
    """Whether ``data`` is a raw X25519 public key (32 bytes)."""
    return isinstance(data, (bytes, bytearray)) and len(data) == KEY_BYTES
