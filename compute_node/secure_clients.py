"""A node's half of secure aggregation: its clients' secrets for the rounds in progress.

A client's secrets for a round (`SecAggClient`: two key pairs and a self-mask seed) are
made at the keys phase and live here, in this process only, until the client has answered
the unmask phase; they never leave the node except as the protocol allows (public keys,
shares sealed to neighbours, one share of each neighbour's secret). A client's phases come
to the node that made its secrets (the coordinator pins them: `UnitSpec.only_node`).

What a peer can make a node keep is bounded: at most `MAX_HELD` clients' secrets (the
oldest go first) and none older than `HELD_SECONDS`; each holds its round's public keys (the
shares phase's list of clients, within the request's size limit).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from thrift_trainer.training.privacy import distributed
from thrift_trainer.training.schema import PrivacySettings, SecureAggregationSettings
from thrift_trainer.training.secure_aggregation import messages
from thrift_trainer.training.secure_aggregation.client import SecAggClient
from thrift_trainer.training.secure_aggregation.errors import SecAggError

MAX_HELD = 1024  # clients' round secrets a node keeps at once
HELD_SECONDS = 3600.0  # a round's secrets are dropped after this, answered or not

Held = tuple[str, str, str]  # run id, context, client


class SecureClients:
    """The round secrets of the clients this node computes; see the module docstring."""

    def __init__(self, max_held: int = MAX_HELD, held_seconds: float = HELD_SECONDS) -> None:
        self._held: OrderedDict[Held, tuple[float, SecAggClient]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_held, self.held_seconds = max_held, held_seconds

    def phase(self, kind: str, run_id: str, round_index: int, client: str,
              raw: bytes | None, settings: SecureAggregationSettings) -> bytes:
        """The answer to one phase of ``client``'s secure round; SecAggError when the
        request is out of order, malformed, or names secrets this node does not hold."""
        message = messages.decode(raw, "context")
        context = messages.context_of(message, run_id, round_index)
        held = (run_id, context, client)
        if kind == messages.KEYS:
            secrets = SecAggClient(context.encode(), client)
            self._keep(held, secrets)
            c_public, s_public = secrets.public_keys()
            return messages.encode({"c": messages.to_text(c_public),
                                    "s": messages.to_text(s_public),
                                    "b": messages.to_text(secrets.seed_commitment())})
        secrets = self._get(held)
        if kind == messages.SHARES:
            sealed = secrets.share_keys(messages.key_map(message.get("keys")),
                                        settings.neighbours, settings.threshold,
                                        messages.names(message.get("u1"), "u1"))
            return messages.encode({"sealed": messages.text_map(sealed)})
        if kind == messages.UNMASK:
            try:
                revealed = secrets.unmask(messages.byte_map(message.get("sealed"), "sealed"),
                                          messages.names(message.get("u3"), "u3"))
            finally:
                self._forget(held)  # answered once: the secrets are spent
            return messages.encode({"revealed": {
                owner: [kind_, messages.to_text(share)]
                for owner, (kind_, share) in revealed.items()}})
        raise SecAggError(f"unknown secure-aggregation phase {kind!r}")

    def mask(self, run_id: str, round_index: int, client: str, raw: bytes | None,
             update: Mapping[str, np.ndarray], settings: SecureAggregationSettings,
             privacy: PrivacySettings) -> dict[str, np.ndarray]:
        """``update`` (a client's delta) quantised and masked for the round: its tensors in
        name order as one vector, then cut back into tensors of the ring's integers. In a
        private run the update is first clipped and noised here, on the client's node
        (training/privacy/distributed.py)."""
        message = messages.decode(raw, "context", "u2", "weight", "scale")
        context = messages.context_of(message, run_id, round_index)
        secrets = self._get((run_id, context, client))
        weight, scale = _number(message["weight"], "weight"), _number(message["scale"], "scale")
        if privacy.enabled:
            update = distributed.privatized(update, privacy, settings.noise_clients)
        names = sorted(update)
        flat = np.concatenate([np.asarray(update[name], dtype=np.float64).ravel()
                               for name in names]) if names else np.zeros(0)
        masked, _ = secrets.mask(flat, weight, messages.names(message["u2"], "u2"),
                                 settings.clip_range, scale, settings.bits)
        signed = masked.view(messages.wire_dtype(settings.bits))  # the wire carries no unsigned
        return split_like(signed, {name: np.shape(update[name]) for name in names},
                          signed.dtype)

    def _keep(self, held: Held, secrets: SecAggClient) -> None:
        now = time.monotonic()
        with self._lock:
            self._held[held] = (now, secrets)
            self._held.move_to_end(held)
            while self._held and (len(self._held) > self.max_held
                                  or next(iter(self._held.values()))[0]
                                  < now - self.held_seconds):
                self._held.popitem(last=False)

    def _get(self, held: Held) -> SecAggClient:
        with self._lock:
            entry = self._held.get(held)
        if entry is None or entry[0] < time.monotonic() - self.held_seconds:
            raise SecAggError(f"this node holds no secrets of {held[2]} for round context "
                              f"{held[1]} (it restarted, or that round is over)")
        return entry[1]

    def _forget(self, held: Held) -> None:
        with self._lock:
            self._held.pop(held, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def split_like(flat: np.ndarray, shapes: Mapping[str, tuple[int, ...]],
               dtype: np.dtype) -> dict[str, np.ndarray]:
    """``flat`` cut into tensors of ``shapes`` (in the mapping's order)."""
    out, start = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = np.ascontiguousarray(flat[start:start + size], dtype=dtype).reshape(shape)
        start += size
    if start != flat.size:
        raise SecAggError(f"a vector of {flat.size} values does not fill tensors of "
                          f"{start}")
    return out


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not np.isfinite(value) or value <= 0:
        raise SecAggError(f"{what} must be a positive number, got {value!r}")
    return float(value)
