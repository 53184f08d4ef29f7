"""Client sampling: a pure function of (round, seed, available clients); counts and
fractions, over-selection, and Poisson sampling's mean."""

from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest

from thrift_trainer.training.clients import ClientsError
from thrift_trainer.training.clients.sampling import (
    client_key,
    client_keys,
    poisson_sample,
    sample,
    stream_draw,
    target_count,
)

CLIENTS = [f"client-{i:03d}" for i in range(100)]


def test_the_same_seed_and_round_sample_the_same_clients_without_state() -> None:
    first = sample(4, 7, CLIENTS, 10)
    assert sample(4, 7, CLIENTS, 10) == first  # as a resumed run would ask again
    assert sample(4, 7, list(reversed(CLIENTS)), 10) == first  # whatever the order
    assert sample(5, 7, CLIENTS, 10) != first
    assert sample(4, 8, CLIENTS, 10) != first
    assert first == sorted(first) and len(set(first)) == 10 and set(first) <= set(CLIENTS)


NAMES = ["c1", "client-007", 'qu"ote', "back\\slash", "tab\there", "ünï", "日本", "😀",
         "", "a]b", "\x00\x1f", "x" * 300]


@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_a_client_s_key_is_the_hash_of_the_json_of_the_draw_and_its_name(key) -> None:
    # the documented definition: a draw of a resumed run, or of an older release, must
    # find the same keys, whatever the names hold
    def defined(client: str) -> int:
        text = json.dumps(["sample", 12, 3, client]).encode()
        digest = (hashlib.sha256(text) if key is None
                  else hmac.new(key, text, hashlib.sha256)).digest()
        return int.from_bytes(digest[:8], "little")

    assert client_keys("sample", 12, 3, NAMES, key) == [defined(name) for name in NAMES]
    assert [client_key("sample", 12, 3, name, key) for name in NAMES] == [
        defined(name) for name in NAMES]


def test_a_stream_draws_the_candidate_of_the_smallest_key() -> None:
    keys = dict(zip(NAMES, client_keys("stream:4", 9, 2, NAMES), strict=True))
    assert stream_draw(9, 4, 2, NAMES) == min(NAMES, key=keys.__getitem__)


def test_rounds_spread_over_the_clients() -> None:
    counts = {client: 0 for client in CLIENTS}
    for round_index in range(200):
        for client in sample(round_index, 0, CLIENTS, 10):
            counts[client] += 1
    assert all(client_count > 0 for client_count in counts.values())
    assert np.std(list(counts.values())) < 10  # each about 20 times, binomial sd ~4


@pytest.mark.parametrize(("per_round", "available", "expected"), [
    (10, 100, 10), (10, 4, 4), (1, 1, 1), (0.1, 100, 10), (0.3, 10, 3), (0.7, 10, 7),
    (0.01, 30, 1), (0.5, 3, 1), (0.99, 3, 2), (5, 0, 0), (np.int64(3), 9, 3),
])
def test_a_count_or_a_fraction_of_the_available(per_round, available, expected) -> None:
    assert target_count(per_round, available) == expected
    assert len(sample(0, 1, CLIENTS[:available], per_round)) == expected


@pytest.mark.parametrize(("target", "over_select", "available", "asked"), [
    (10, 1.3, 100, 13), (10, 1.25, 100, 13), (3, 1.5, 100, 5), (10, 2.0, 15, 15),
    (7, 1.0, 100, 7),
])
def test_over_selection_asks_ceil_of_target_times_factor(target, over_select, available,
                                                         asked) -> None:
    chosen = sample(2, 3, CLIENTS[:available], target, over_select=over_select)
    assert len(chosen) == asked
    assert set(sample(2, 3, CLIENTS[:available], target)) <= set(chosen)


def test_a_client_that_comes_or_goes_moves_no_other_client() -> None:
    base = poisson_sample(9, 2, CLIENTS, 0.3)
    fewer = poisson_sample(9, 2, CLIENTS[1:], 0.3)
    assert fewer == [client for client in base if client != CLIENTS[0]]


def test_poisson_sampling_takes_each_client_with_probability_q() -> None:
    q, rounds = 0.2, 400
    sizes = [len(poisson_sample(r, 5, CLIENTS, q)) for r in range(rounds)]
    mean = float(np.mean(sizes))
    assert abs(mean - q * len(CLIENTS)) < 1.0  # standard error 4 / sqrt(400) = 0.2
    assert min(sizes) < mean < max(sizes)  # the size varies from round to round
    assert poisson_sample(3, 5, CLIENTS, 1.0) == CLIENTS
    assert poisson_sample(3, 5, CLIENTS, q) == poisson_sample(3, 5, CLIENTS, q)


def test_duplicates_count_once() -> None:
    assert sample(0, 0, ["a", "b", "a"], 5) == ["a", "b"]


@pytest.mark.parametrize(("call", "words"), [
    (lambda: sample(0, 0, CLIENTS, 0), "per_round as a count must be >= 1"),
    (lambda: sample(0, 0, CLIENTS, 1.0), "per_round as a fraction must be in \\(0, 1\\)"),
    (lambda: sample(0, 0, CLIENTS, "ten"), "per_round must be a count or a fraction"),
    (lambda: sample(0, 0, CLIENTS, True), "per_round must be a count or a fraction"),
    (lambda: sample(0, 0, CLIENTS, 5, over_select=0.9), "over_select must be a number >= 1"),
    (lambda: sample(-1, 0, CLIENTS, 5), "round_index must be an integer >= 0"),
    (lambda: sample(0, 0, [1, 2], 1), "a client is named by a string"),
    (lambda: poisson_sample(0, 0, CLIENTS, 0.0), "q must be a probability in \\(0, 1\\]"),
    (lambda: poisson_sample(0, 0.5, CLIENTS, 0.1), "seed must be an integer"),
])
def test_settings_that_cannot_sample_raise_one_line(call, words) -> None:
    with pytest.raises(ClientsError, match=words):
        call()
