"""Which clients take part in a round: a pure function of (round, seed, available clients)
and, in a private run, of its secret noise key.

No state is kept, so a resumed run samples the clients it would have sampled. Each client
gets a key per round, the sha256 of (seed, round, its name): `sample` takes the clients of
the smallest keys, `poisson_sample` each client whose key, read as a fraction, is below q.
A private run's draw is keyed by its noise key (training/privacy/noise_key.py) instead:
HMAC-SHA256 under the key, so that knowing the public seed does not tell who was drawn,
which the accounting's amplification by sampling assumes.
Keys rather than a shuffle by a numpy generator because a key is a client's own: the
choice does not depend on the order the available clients are listed in, a client that
comes or goes moves no other client's chance, an over-selected round's clients include
those of the plain round, and the hash is the same under every numpy version.

Over-selection (Bonawitz et al. 2019, "Towards federated learning at scale") asks
ceil(target x over_select) clients so that the round can close at its target when some
drop out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import numbers
from collections.abc import Iterable

from thrift_trainer.training.clients.errors import ClientsError

_KEY_BITS = 64
_DIGITS = 9  # float products rounded first: 10 x 1.3 is 13.000000000000002, not 14


def sample(round_index: int, seed: int, available: list[str], per_round: int | float,
           over_select: float = 1.0, purpose: str = "sample",
           key: bytes | None = None) -> list[str]:
    """The clients asked to take part in round ``round_index``, sorted by name.

    ``per_round`` is a count (an int >= 1, capped by the available clients) or a fraction
    in (0, 1) of the available clients, at least 1. ``over_select`` >= 1 asks
    ceil(target x over_select) clients, capped by the available. ``purpose`` names the
    draw: another purpose (federated evaluation's) draws independently of training's.
    ``key``: a private run's noise key, which the draw is then keyed by."""
    clients = _distinct(available)
    if not _is_real(over_select) or not math.isfinite(over_select) or over_select < 1:
        raise ClientsError(f"over_select must be a number >= 1, got {over_select!r}")
    target = target_count(per_round, len(clients))
    asked = min(len(clients), math.ceil(round(target * over_select, _DIGITS)))
    keys = client_keys(purpose, seed, round_index, clients, key)
    ranked = sorted(range(len(clients)), key=keys.__getitem__)
    return sorted(clients[i] for i in ranked[:asked])


def target_count(per_round: int | float, available: int) -> int:
    """How many clients a round wants of ``available``: a count or a fraction (see
    `sample`); 0 only when none is available."""
    if _is_int(per_round):
        if per_round < 1:
            raise ClientsError(f"per_round as a count must be >= 1, got {per_round}")
        return min(int(per_round), available)
    if not _is_real(per_round):
        raise ClientsError(f"per_round must be a count or a fraction, got {per_round!r}")
    if not 0 < per_round < 1:
        raise ClientsError(f"per_round as a fraction must be in (0, 1), got {per_round!r} "
                           f"(a count is an integer)")
    return min(available, max(1, math.floor(round(per_round * available, _DIGITS))))


def poisson_sample(round_index: int, seed: int, available: list[str], q: float,
                   key: bytes | None = None) -> list[str]:
    """Each available client independently with probability ``q`` (Poisson sampling, as
    differentially private FL accounts for it), sorted by name; the round may be empty.
    ``key``: a private run's noise key, which the draw is then keyed by."""
    if not _is_real(q) or not 0 < q <= 1:
        raise ClientsError(f"q must be a probability in (0, 1], got {q!r}")
    limit = q * 2**_KEY_BITS
    clients = _distinct(available)
    keys = client_keys("poisson", seed, round_index, clients, key)
    return sorted(client for client, k in zip(clients, keys, strict=True) if k < limit)


def client_key(purpose: str, seed: int, round_index: int, client: str,
               key: bytes | None = None) -> int:
    """A client's key for one round: 64 bits of sha256 over the JSON of the arguments
    (JSON so that no name can be read as another split differently); of HMAC-SHA256
    under ``key`` when a private run's noise key is given."""
    return client_keys(purpose, seed, round_index, [client], key)[0]


def client_keys(purpose: str, seed: int, round_index: int, clients: list[str],
                key: bytes | None = None) -> list[int]:
    """`client_key` of each of ``clients``, in their order: the hash of the arguments'
    common prefix is computed once and copied for each client (a round draws from every
    available client, thousands of them)."""
    if not _is_int(round_index) or round_index < 0:
        raise ClientsError(f"round_index must be an integer >= 0, got {round_index!r}")
    if not _is_int(seed):
        raise ClientsError(f"seed must be an integer, got {seed!r}")
    # json.dumps([purpose, seed, round, client]) is this prefix, the client, then "]"
    prefix = json.dumps([purpose, int(seed), int(round_index)])[:-1].encode() + b", "
    common = hashlib.sha256(prefix) if key is None else hmac.new(key, prefix, hashlib.sha256)
    keys = []
    for client in clients:
        if not isinstance(client, str):
            raise ClientsError(f"a client is named by a string, got {client!r}")
        hasher = common.copy()
        hasher.update(_json_string(client) + b"]")
        keys.append(int.from_bytes(hasher.digest()[:_KEY_BITS // 8], "little"))
    return keys


def _json_string(text: str) -> bytes:
    """``text`` as json.dumps writes it (ASCII, escaped)."""
    return json.encoder.encode_basestring_ascii(text).encode()


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _distinct(available: Iterable[str]) -> list[str]:
    """The available clients once each (two holders of one client name it twice); their
    names are checked where they are hashed (`client_keys`)."""
    return list(dict.fromkeys(available))


def stream_draw(seed: int, version: int, draw_index: int,
                candidates: Iterable[str]) -> str | None:
    """The client a stream (buffered asynchronous training, FedBuff) trains next: one of
    ``candidates`` (the clients held by a node and not training now), uniformly, as the
    candidate of the smallest key of (seed, version, draw). A pure function of its
    arguments, so that a resumed stream draws what it drew; None when there is none."""
    if not _is_int(version) or version < 0 or not _is_int(draw_index) or draw_index < 0:
        raise ClientsError(f"version and draw_index must be integers >= 0, got "
                           f"{version!r}, {draw_index!r}")
    clients = _distinct(candidates)
    if not clients:
        return None
    purpose = f"stream:{int(version)}"
    keys = client_keys(purpose, seed, draw_index, clients)
    return clients[min(range(len(clients)), key=keys.__getitem__)]
