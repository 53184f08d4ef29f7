"""What the phases of a secure round carry between the coordinator and a client's node.

A phase travels as a unit of its own kind (`KEYS`, `SHARES`, `UNMASK`) through the usual
``train_with_weights`` call, and the masked training unit as a plain training unit; the
phase's data is a small JSON object in the request's and the answer's
``secure_aggregation`` field, keys and ciphertexts in base64:

* keys: ``{"context"}`` -> ``{"c", "s", "b"}`` (the client's two public keys and its
  commitment to its self-mask seed);
* shares: ``{"context", "u1": [clients], "keys": {client: [c, s]}}`` (the names of
  every client that advertised keys, and the keys of this client and its neighbours among
  them) -> ``{"sealed": {neighbour: ciphertext}}``;
* the training unit: ``{"context", "u2": [clients], "weight", "scale"}`` -> its update,
  masked, in the ring's integers;
* unmask: ``{"context", "u3": [clients], "sealed": {sender: ciphertext}}`` (the ciphertexts
  addressed to this client) -> ``{"revealed": {owner: [kind, share]}}``.

The context, ``<run>/<round>/<nonce>``, names one try of one round: a round computed again
(after a resume) starts from fresh secrets.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.ring import ring_dtype

KEYS, SHARES, UNMASK = "secagg_keys", "secagg_shares", "secagg_unmask"
PHASES = (KEYS, SHARES, UNMASK)


def wire_dtype(bits: int) -> np.dtype:
    """The signed dtype a masked update's ring integers travel as, bit for bit (the wire
    carries no unsigned integers wider than a byte): int32 for uint32, int64 for uint64."""
    return np.dtype(f"int{ring_dtype(bits).itemsize * 8}")


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(raw: bytes | None, *required: str) -> dict[str, Any]:
    """The JSON object of a phase, with every ``required`` key; SecAggError otherwise."""
    if not raw:
        raise SecAggError("the unit carries no secure-aggregation data")
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SecAggError(f"secure-aggregation data is not JSON: {str(exc)[:100]}") from None
    if not isinstance(message, dict):
        raise SecAggError("secure-aggregation data must be a JSON object")
    missing = [key for key in required if key not in message]
    if missing:
        raise SecAggError(f"secure-aggregation data lacks {', '.join(missing)}")
    return message


def to_text(data: bytes) -> str:
    return base64.b64encode(data).decode()


def from_text(text: Any) -> bytes:
    if not isinstance(text, str):
        raise SecAggError(f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SecAggError("invalid base64 in secure-aggregation data") from None


def names(value: Any, what: str) -> list[str]:
    """A list of client names, checked."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise SecAggError(f"{what} must be a list of client names")
    return value


def byte_map(value: Any, what: str) -> dict[str, bytes]:
    """``{name: base64}`` decoded."""
    if not isinstance(value, dict):
        raise SecAggError(f"{what} must be an object")
    return {str(name): from_text(text) for name, text in value.items()}


def text_map(value: Mapping[str, bytes]) -> dict[str, str]:
    return {name: to_text(data) for name, data in value.items()}


def key_map(value: Any) -> dict[str, tuple[bytes, bytes]]:
    """``{client: [c, s]}`` decoded."""
    if not isinstance(value, dict):
        raise SecAggError("keys must be an object")
    keys = {}
    for name, pair in value.items():
        if not (isinstance(pair, list) and len(pair) == 2):
            raise SecAggError(f"the keys of {name} must be a pair")
        keys[str(name)] = (from_text(pair[0]), from_text(pair[1]))
    return keys


def context_of(message: Mapping[str, Any], run_id: str, round_index: int) -> str:
    """The message's context, which must belong to the request's run and round."""
    context = message.get("context")
    if not isinstance(context, str) or not context.startswith(f"{run_id}/{round_index}/"):
        raise SecAggError(f"the secure-aggregation context {str(context)[:80]!r} is not "
                          f"one of run {run_id} round {round_index}")
    return context
