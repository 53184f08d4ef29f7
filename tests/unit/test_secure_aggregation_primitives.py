"""The primitives of secure aggregation: the ring, the fixed-point encoding, the PRG,
Shamir sharing, key agreement and sealing, the neighbour graph."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from thrift_trainer.training.secure_aggregation import keys, prg, ring, shamir
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.graph import (
    neighbours,
    positions,
    share_threshold,
)
from thrift_trainer.training.secure_aggregation.quantize import (
    dequantize,
    error_bound,
    quantize,
    scale_for,
)

# --- ring ---


@pytest.mark.parametrize(("bits", "dtype"), [(8, np.uint32), (16, np.uint32), (32, np.uint32),
                                             (33, np.uint64), (48, np.uint64), (62, np.uint64)])
def test_ring_dtype_follows_the_bits(bits: int, dtype: type) -> None:
    assert ring.ring_dtype(bits) == np.dtype(dtype)
    assert ring.ring_mask(bits) == 2**bits - 1


@pytest.mark.parametrize("bits", [7, 63, 64, 0])
def test_ring_bits_outside_the_bounds_are_refused(bits: int) -> None:
    with pytest.raises(ValueError, match="ring bits"):
        ring.ring_dtype(bits)


@pytest.mark.parametrize("bits", [16, 32, 48, 62])
def test_ring_add_and_sub_wrap_mod_two_to_the_bits(bits: int) -> None:
    rng = np.random.default_rng(bits)
    a = rng.integers(0, 2**bits, 1000, dtype=np.uint64).astype(ring.ring_dtype(bits))
    b = rng.integers(0, 2**bits, 1000, dtype=np.uint64).astype(ring.ring_dtype(bits))
    total, difference = ring.add(a, b, bits), ring.sub(a, b, bits)
    assert total.dtype == difference.dtype == ring.ring_dtype(bits)
    pairs = list(zip(a.tolist(), b.tolist(), strict=True))
    assert total.tolist() == [(x + y) % 2**bits for x, y in pairs]
    assert difference.tolist() == [(x - y) % 2**bits for x, y in pairs]


# --- quantize ---


@pytest.mark.parametrize("bits", [16, 32, 48])
def test_negative_values_round_trip_through_the_ring(bits: int) -> None:
    values = np.array([[-1.0, -0.5, -1e-3], [0.0, 0.25, 0.999]])
    scale = scale_for(1.0, bits, 10)
    encoded, clipped = quantize(values, 0.5, 1.0, scale, bits)
    assert encoded.shape == values.shape and encoded.dtype == ring.ring_dtype(bits)
    assert clipped == 0
    assert int(encoded[0, 0]) >= 2**(bits - 1)  # a negative value, in two's complement
    decoded = dequantize(encoded, scale, bits)
    assert decoded.dtype == np.float64
    assert np.max(np.abs(decoded - 0.5 * values)) <= error_bound(1, scale)


def test_values_beyond_the_clip_range_are_clipped_and_counted() -> None:
    scale = scale_for(2.0, 32, 5)
    encoded, clipped = quantize(np.array([-7.0, -2.0, 1.0, 2.5, 3.0]), 1.0, 2.0, scale, 32)
    assert clipped == 3  # -7, 2.5, 3; -2 is on the bound
    assert list(dequantize(encoded, scale, 32)) == pytest.approx([-2, -2, 1, 2, 2], abs=1e-8)


@pytest.mark.parametrize("bits", [16, 32, 48])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_extreme_sum_at_the_scale_for_limit_does_not_overflow(bits: int,
                                                                  sign: float) -> None:
    clients, clip = 20, 3.0
    scale = scale_for(clip, bits, clients)
    assert scale == (2**(bits - 1) - 1 - clients) / clip
    extreme = np.full(4, sign * clip)

    def summed(at_scale: float) -> np.ndarray:
        terms = [quantize(extreme, 1 / clients, clip, at_scale, bits)[0]
                 for _ in range(clients)]
        return dequantize(functools.reduce(lambda a, b: ring.add(a, b, bits), terms),
                          at_scale, bits)

    assert np.all(np.abs(summed(scale) - sign * clip) <= error_bound(clients, scale))
    # the negative control: at twice the scale the same sum wraps to the other sign
    assert np.all(np.sign(summed(2 * scale)) == -sign)


def test_scale_for_refuses_too_few_bits_for_the_clients() -> None:
    assert scale_for(1.0, 8, 126) == 1.0
    with pytest.raises(ValueError, match="too few"):
        scale_for(1.0, 8, 127)
    with pytest.raises(ValueError, match="clip_range"):
        scale_for(0.0, 16, 2)


def test_quantize_refuses_what_has_no_place_in_the_ring() -> None:
    with pytest.raises(ValueError, match="finite"):
        quantize(np.array([0.0, np.nan]), 1.0, 1.0, 100.0, 16)
    with pytest.raises(ValueError, match="weight"):
        quantize(np.zeros(2), 1.5, 1.0, 100.0, 16)


def test_error_bound_is_half_a_step_per_client() -> None:
    assert error_bound(20, 1000.0) == 0.01


# --- PRG ---


@pytest.mark.parametrize("bits", [16, 32, 48, 62])
def test_expand_is_a_deterministic_stream_masked_to_the_bits(bits: int) -> None:
    seed = bytes(range(32))
    mask = prg.expand(seed, 5000, bits)
    assert mask.dtype == ring.ring_dtype(bits) and mask.shape == (5000,)
    assert np.array_equal(mask, prg.expand(seed, 5000, bits))
    assert np.array_equal(mask[:100], prg.expand(seed, 100, bits))  # a prefix of the stream
    assert int(mask.max()) < 2**bits and int(mask.max()) >= 2**bits * 0.99
    assert not np.array_equal(mask, prg.expand(bytes(31) + b"\x01", 5000, bits))


def test_expand_refuses_a_seed_of_the_wrong_length() -> None:
    with pytest.raises(SecAggError, match="32 bytes"):
        prg.expand(bytes(16), 10, 32)


# --- Shamir ---

SECRET = bytes(range(1, 33))


def test_any_threshold_shares_rebuild_the_secret() -> None:
    shares = shamir.split(SECRET, [3, 5, 8, 9, 11, 14, 20], 4)
    for chosen in itertools.combinations(shares, 4):
        assert shamir.combine({x: shares[x] for x in chosen}, 32) == SECRET
    assert shamir.combine(shares, 32) == SECRET  # more than t agree too


def test_fewer_than_threshold_shares_do_not_rebuild_the_secret() -> None:
    shares = shamir.split(SECRET, [3, 5, 8, 9, 11, 14, 20], 4)
    for chosen in itertools.combinations(shares, 3):
        # a random field element: above 2^256 but with chance 2^-265
        with pytest.raises(SecAggError, match="do not rebuild"):
            shamir.combine({x: shares[x] for x in chosen}, 32)


def test_a_64_byte_secret_with_leading_zeros_round_trips() -> None:
    secret = bytes(3) + bytes(range(61))
    shares = shamir.split(secret, [1, 2, 3], 3)
    assert shamir.combine(shares, 64) == secret
    try:  # 2 of 3 shares give another field element: below 2^512 with chance 1/512
        rebuilt = shamir.combine({1: shares[1], 2: shares[2]}, 64)
    except SecAggError:
        rebuilt = None
    assert rebuilt != secret


def test_share_coordinates_must_be_distinct_and_in_the_field() -> None:
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(SECRET, [1, 2, 2], 2)
    with pytest.raises(ValueError, match="not in 1..p-1"):
        shamir.split(SECRET, [0, 1], 2)
    with pytest.raises(ValueError, match="not in 1..p-1"):
        shamir.split(SECRET, [1, shamir.PRIME], 2)
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(SECRET, [1, 2], 3)
    with pytest.raises(ValueError, match="at most 64"):
        shamir.split(bytes(65), [1, 2], 2)


def test_a_share_travels_as_66_bytes() -> None:
    y = shamir.split(SECRET, [1, 2], 2)[2]
    data = shamir.share_to_bytes(y)
    assert len(data) == shamir.SHARE_BYTES == 66
    assert shamir.share_from_bytes(data) == y
    with pytest.raises(SecAggError):
        shamir.share_from_bytes(data[1:])
    with pytest.raises(SecAggError):
        shamir.share_from_bytes(shamir.PRIME.to_bytes(66, "big"))


# --- keys ---


def test_two_clients_agree_on_a_key_bound_to_its_info() -> None:
    alice, bob = keys.generate(), keys.generate()
    key = keys.agree(alice, keys.public_bytes(bob), b"round 1")
    assert len(key) == 32
    assert key == keys.agree(bob, keys.public_bytes(alice), b"round 1")
    assert key != keys.agree(bob, keys.public_bytes(alice), b"round 2")
    assert key != keys.agree(keys.generate(), keys.public_bytes(alice), b"round 1")


@pytest.mark.parametrize("public", [bytes(31), bytes(32)])  # short; the low-order point 0
def test_agreeing_with_a_bad_public_key_is_refused(public: bytes) -> None:
    with pytest.raises(SecAggError):
        keys.agree(keys.generate(), public, b"info")


def test_sealed_messages_open_only_unaltered_under_their_key_and_data() -> None:
    key, other = bytes(range(32)), bytes(32)
    sealed = keys.seal(key, b"two shares", b"from a to b")
    assert keys.open_sealed(key, sealed, b"from a to b") == b"two shares"
    assert keys.seal(key, b"two shares", b"from a to b") != sealed  # a fresh nonce
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    for args in ((key, tampered, b"from a to b"), (key, sealed, b"from b to a"),
                 (other, sealed, b"from a to b"), (key, sealed[:20], b"from a to b")):
        with pytest.raises(SecAggError):
            keys.open_sealed(*args)


# --- graph ---

NAMES = [f"client-{i:02d}" for i in range(20)]


@pytest.mark.parametrize(("k", "degree"), [(6, 6), (5, 6), (2, 2), (18, 18)])
def test_the_sparse_graph_joins_the_nearest_on_the_ring(k: int, degree: int) -> None:
    graph = neighbours(list(reversed(NAMES)), k)
    assert sorted(graph) == NAMES
    for i, name in enumerate(NAMES):
        assert len(graph[name]) == degree and name not in graph[name]
        assert NAMES[(i + 1) % 20] in graph[name] and NAMES[(i - 1) % 20] in graph[name]
        assert all(name in graph[other] for other in graph[name])  # symmetric
    assert graph[NAMES[0]] == sorted(NAMES[1:1 + degree // 2] + NAMES[20 - degree // 2:])


@pytest.mark.parametrize("k", [0, 19, 25])
def test_k_zero_or_past_the_round_joins_everyone(k: int) -> None:
    graph = neighbours(NAMES, k)
    assert all(graph[name] == [other for other in NAMES if other != name] for name in NAMES)


def test_the_graph_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="distinct"):
        neighbours(["a", "b", "a"], 2)


@pytest.mark.parametrize(("fraction", "k", "needed"),
                         [(0.6, 6, 4), (0.7, 10, 7), (1.0, 6, 6), (0.6, 19, 12), (0.6, 0, 1),
                          (0.51, 2, 2)])
def test_share_threshold_is_a_majority_of_the_neighbours(fraction: float, k: int,
                                                         needed: int) -> None:
    assert share_threshold(fraction, k) == needed


@pytest.mark.parametrize(("fraction", "k"), [(0.5, 6), (0.3, 19), (0.0, 6), (1.5, 6)])
def test_share_threshold_refuses_half_or_less(fraction: float, k: int) -> None:
    with pytest.raises(ValueError):
        share_threshold(fraction, k)


def test_positions_are_one_based_in_sorted_order() -> None:
    assert positions(["c", "a", "b"]) == {"a": 1, "b": 2, "c": 3}
