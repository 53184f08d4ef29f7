"""Secure aggregation end to end, in one process: clients' phases, the coordinator's
unmasking, dropouts at each phase, and what is refused."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import pytest

from thrift_trainer.training.secure_aggregation import client as client_module
from thrift_trainer.training.secure_aggregation import keys as keys_module
from thrift_trainer.training.secure_aggregation import shamir
from thrift_trainer.training.secure_aggregation.client import SecAggClient
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.graph import neighbours, positions
from thrift_trainer.training.secure_aggregation.quantize import (
    dequantize,
    error_bound,
    quantize,
    scale_for,
)
from thrift_trainer.training.secure_aggregation.server import unmask_sum

CONTEXT = b"run 7f3a / round 3"
CLIP = 1.0
THRESHOLD = 0.6
# float64 rounding of the weighted values, of the plain sum and of the division by the
# scale: a few ulps of values below 1, far below every error bound tested
FLOAT_SLACK = 1e-14


@dataclass
class Round:
    """A round of ``names`` run by the book, the coordinator's routing included."""

    names: list[str]
    k: int
    bits: int = 32
    clients: dict[str, SecAggClient] = field(default_factory=dict)
    keys: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    inbox: dict[str, dict[str, bytes]] = field(default_factory=dict)
    masked: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clients = {name: SecAggClient(CONTEXT, name) for name in self.names}
        self.scale = scale_for(CLIP, self.bits, len(self.names))

    def advertise(self, u1: Collection[str]) -> None:
        self.keys = {name: self.clients[name].public_keys() for name in u1}

    def share(self, u2: Collection[str]) -> None:
        for sender in sorted(u2):
            for recipient, sealed in self.clients[sender].share_keys(
                    self.keys, self.k, THRESHOLD).items():
                self.inbox.setdefault(recipient, {})[sender] = sealed

    def mask(self, updates: dict[str, np.ndarray], weights: dict[str, float],
             u2: Collection[str], senders: Collection[str]) -> None:
        for name in sorted(senders):
            self.masked[name], clipped = self.clients[name].mask(
                updates[name], weights[name], u2, CLIP, self.scale, self.bits)
            assert clipped == 0 and self.masked[name].shape == (updates[name].size,)

    def unmask(self, u3: Collection[str]) -> dict[str, dict[str, tuple[str, bytes]]]:
        return {name: self.clients[name].unmask(self.inbox.get(name, {}), u3)
                for name in sorted(u3)}

    def total(self, u2: Collection[str], u3: Collection[str],
              revealed: dict[str, dict[str, tuple[str, bytes]]],
              left_out: str | None = None) -> np.ndarray:
        inputs = [self.masked[name] for name in sorted(u3) if name != left_out]
        ring_sum = unmask_sum(inputs, self.keys, u2, u3, revealed, self.k, THRESHOLD,
                              CONTEXT, self.bits)
        return dequantize(ring_sum, self.scale, self.bits)


NAMES = [f"client-{i:02d}" for i in range(20)]
# spread around the ring, so that every client keeps a majority of its 6 neighbours
BEFORE_SHARES = {"client-03", "client-12"}  # in U1, not U2
BEFORE_INPUT = {"client-06", "client-09", "client-16"}  # in U2, not U3


def updates_and_weights(shape: tuple[int, ...],
                        seed: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    rng = np.random.default_rng(seed)
    weights = rng.random(len(NAMES))
    weights /= weights.sum()
    return ({name: rng.uniform(-CLIP, CLIP, shape) for name in NAMES},
            dict(zip(NAMES, weights.tolist(), strict=True)))


def run_round(k: int, bits: int, shape: tuple[int, ...], before_shares: set[str],
              before_input: set[str], seed: int = 0) -> tuple[Round, set[str], set[str], dict]:
    """A round with those dropouts; returns it, U2, U3 and what U3 revealed."""
    updates, weights = updates_and_weights(shape, seed)
    secagg = Round(NAMES, k, bits)
    secagg.advertise(NAMES)
    u2 = set(NAMES) - before_shares
    secagg.share(u2)
    u3 = u2 - before_input
    secagg.mask(updates, weights, u2, u3)
    revealed = secagg.unmask(u3)
    secagg.plain = sum(weights[name] * updates[name] for name in u3).ravel()
    return secagg, u2, u3, revealed


@pytest.mark.parametrize(("k", "bits", "shape"), [(6, 32, (3, 50)), (6, 48, (7,)),
                                                  (0, 32, (7,)), (0, 48, (3, 50))])
@pytest.mark.parametrize(("before_shares", "before_input"),
                         [(set(), set()), (set(), BEFORE_INPUT),
                          (BEFORE_SHARES, BEFORE_INPUT)],
                         ids=["no dropouts", "3 before input", "2 before shares, 3 before input"])
def test_the_unmasked_sum_is_the_weighted_sum_over_u3(k: int, bits: int,
                                                      shape: tuple[int, ...],
                                                      before_shares: set[str],
                                                      before_input: set[str]) -> None:
    secagg, u2, u3, revealed = run_round(k, bits, shape, before_shares, before_input)
    bound = error_bound(len(u3), secagg.scale)
    assert np.max(np.abs(secagg.total(u2, u3, revealed) - secagg.plain)) <= bound + FLOAT_SLACK
    # the negative control: one masked input short, the masks no longer cancel
    short = secagg.total(u2, u3, revealed, left_out=sorted(u3)[0])
    assert np.max(np.abs(short - secagg.plain)) > 1000 * bound


def test_a_client_needs_only_its_neighbours_keys_and_u1s_names() -> None:
    """SecAgg+: each client is sent U1's names and its own and its neighbours' keys; the
    round sums as with every key, and a client missing a neighbour's key refuses."""
    updates, weights = updates_and_weights((7,), 4)
    secagg = Round(NAMES, 6)
    secagg.advertise(NAMES)
    graph = neighbours(NAMES, 6)
    for sender in NAMES:
        own = {v: secagg.keys[v] for v in [sender, *graph[sender]]}
        for recipient, sealed in secagg.clients[sender].share_keys(
                own, 6, THRESHOLD, u1=NAMES).items():
            secagg.inbox.setdefault(recipient, {})[sender] = sealed
    secagg.mask(updates, weights, NAMES, NAMES)
    total = secagg.total(NAMES, NAMES, secagg.unmask(NAMES))
    plain = sum(weights[name] * updates[name] for name in NAMES)
    assert np.max(np.abs(total - plain)) <= error_bound(20, secagg.scale) + FLOAT_SLACK
    lone = SecAggClient(CONTEXT, "client-00")
    with pytest.raises(SecAggError, match="no keys for its neighbour client-01"):
        lone.share_keys({"client-00": lone.public_keys()}, 6, THRESHOLD, u1=NAMES)


def test_the_coordinator_needs_only_a_threshold_of_each_clients_neighbours() -> None:
    secagg, u2, u3, revealed = run_round(6, 32, (7,), BEFORE_SHARES, BEFORE_INPUT)
    # client-00 answered, but its answers are not needed: every secret keeps enough shares
    del revealed["client-00"]
    bound = error_bound(len(u3), secagg.scale)
    assert np.max(np.abs(secagg.total(u2, u3, revealed) - secagg.plain)) <= bound + FLOAT_SLACK


@pytest.mark.parametrize("owner", ["client-07", "client-09"])  # its b; its s key (dropped)
def test_too_few_revealed_shares_name_the_client(owner: str) -> None:
    secagg, u2, u3, revealed = run_round(6, 32, (7,), set(), BEFORE_INPUT)
    helpers = sorted(name for name in revealed if owner in revealed[name])
    assert len(helpers) == {"client-07": 4, "client-09": 5}[owner]  # 6 less the dropped
    for name in helpers[:len(helpers) - 3]:  # leaves one fewer than the 4 needed
        del revealed[name][owner]
    with pytest.raises(SecAggError, match=f"client {owner}: 3 shares .* 4 needed"):
        secagg.total(u2, u3, revealed)


def test_a_revealer_sending_the_wrong_kind_is_named() -> None:
    secagg, u2, u3, revealed = run_round(6, 32, (7,), set(), BEFORE_INPUT)
    kind, share = revealed["client-08"]["client-07"]
    assert kind == "b"
    revealed["client-08"]["client-07"] = ("s", share)
    with pytest.raises(SecAggError, match="client client-08: revealed a 's' share of client-07"):
        secagg.total(u2, u3, revealed)


def test_a_wrong_self_mask_share_fails_the_round_instead_of_spoiling_its_sum() -> None:
    """A revealer that sends a b-share crafted to move the rebuilt seed by one (a value
    that still fits a seed, which a random error almost never does): without the seed
    commitments the sum comes out wrong with no error; with them, the owner is named."""
    secagg, u2, u3, revealed = run_round(6, 32, (7,), set(), set())
    at = positions(NAMES)
    used = sorted(at[name] for name in revealed if "client-07" in revealed[name])[:4]
    x = at["client-08"]
    assert x in used  # among the shares the coordinator rebuilds client-07's seed from
    basis = shamir._lagrange_at_zero(x, dict.fromkeys(used, 0))
    kind, share = revealed["client-08"]["client-07"]
    crafted = (shamir.share_from_bytes(share) + pow(basis, -1, shamir.PRIME)) % shamir.PRIME
    revealed["client-08"]["client-07"] = (kind, shamir.share_to_bytes(crafted))
    inputs = [secagg.masked[name] for name in sorted(u3)]
    spoiled = dequantize(unmask_sum(inputs, secagg.keys, u2, u3, revealed, 6, THRESHOLD,
                                    CONTEXT, 32), secagg.scale, 32)
    assert np.max(np.abs(spoiled - secagg.plain)) > 1000 * error_bound(len(u3), secagg.scale)
    commitments = {name: secagg.clients[name].seed_commitment() for name in NAMES}
    with pytest.raises(SecAggError, match="client client-07: its rebuilt self-mask seed is "
                                          "not the one it committed to"):
        unmask_sum(inputs, secagg.keys, u2, u3, revealed, 6, THRESHOLD, CONTEXT, 32,
                   commitments)
    del revealed["client-08"]["client-07"]  # without the wrong share, the others suffice
    total = unmask_sum(inputs, secagg.keys, u2, u3, revealed, 6, THRESHOLD, CONTEXT, 32,
                       commitments)
    assert np.max(np.abs(dequantize(total, secagg.scale, 32) - secagg.plain)) <= \
        error_bound(len(u3), secagg.scale) + FLOAT_SLACK


def test_a_client_refuses_to_reveal_when_too_many_neighbours_dropped() -> None:
    secagg = Round(NAMES, 6)
    secagg.advertise(NAMES)
    secagg.share(NAMES)
    updates, weights = updates_and_weights((7,), 1)
    u3 = set(NAMES) - {"client-04", "client-05", "client-07"}  # 3 of client-06's 6
    secagg.mask(updates, weights, NAMES, u3)
    with pytest.raises(SecAggError, match="client client-06: 3 of its neighbours are in U3"):
        secagg.clients["client-06"].unmask(secagg.inbox["client-06"], u3)


def test_a_client_refuses_to_mask_when_too_few_neighbours_sent_shares() -> None:
    secagg = Round(NAMES, 6)
    secagg.advertise(NAMES)
    u2 = set(NAMES) - {"client-04", "client-05", "client-07"}
    secagg.share(u2)
    updates, weights = updates_and_weights((7,), 1)
    with pytest.raises(SecAggError, match="client client-06: 3 of its neighbours sent"):
        secagg.mask(updates, weights, u2, ["client-06"])


def test_a_client_dropped_from_u3_refuses_to_reveal() -> None:
    secagg = Round(NAMES, 6)
    secagg.advertise(NAMES)
    secagg.share(NAMES)
    updates, weights = updates_and_weights((7,), 2)
    secagg.mask(updates, weights, NAMES, NAMES)  # its input was sent, but never arrived
    late = secagg.clients["client-10"]
    with pytest.raises(SecAggError, match="client client-10: not in U3"):
        late.unmask(secagg.inbox["client-10"], set(NAMES) - {"client-10"})
    with pytest.raises(SecAggError, match="unmask called when done"):  # and never again
        late.unmask(secagg.inbox["client-10"], NAMES)


def test_a_tampered_ciphertext_fails_the_unmask() -> None:
    secagg = Round(NAMES[:5], 0)
    secagg.advertise(secagg.names)
    secagg.share(secagg.names)
    updates, weights = updates_and_weights((7,), 3)
    secagg.mask(updates, weights, secagg.names, secagg.names)
    inbox = dict(secagg.inbox["client-00"])
    sealed = inbox["client-01"]
    inbox["client-01"] = sealed[:20] + bytes([sealed[20] ^ 0x40]) + sealed[21:]
    with pytest.raises(SecAggError, match="does not open"):
        secagg.clients["client-00"].unmask(inbox, secagg.names)


def test_shares_passed_off_as_from_another_sender_do_not_open() -> None:
    secagg = Round(NAMES[:5], 0)
    secagg.advertise(secagg.names)
    secagg.share(secagg.names)
    updates, weights = updates_and_weights((7,), 3)
    secagg.mask(updates, weights, secagg.names, secagg.names)
    inbox = dict(secagg.inbox["client-00"])
    inbox["client-01"] = inbox["client-02"]  # the associated data names the sender
    with pytest.raises(SecAggError, match="does not open"):
        secagg.clients["client-00"].unmask(inbox, secagg.names)


def test_phases_out_of_order_or_twice_are_refused() -> None:
    secagg = Round(NAMES[:4], 0)
    secagg.advertise(secagg.names)
    first = secagg.clients["client-00"]
    with pytest.raises(SecAggError, match="mask called when share_keys"):
        first.mask(np.zeros(3), 0.25, secagg.names, CLIP, secagg.scale, 32)
    with pytest.raises(SecAggError, match="unmask called when share_keys"):
        first.unmask({}, secagg.names)
    secagg.share(secagg.names)
    with pytest.raises(SecAggError, match="share_keys called when mask"):
        first.share_keys(secagg.keys, 0, THRESHOLD)
    with pytest.raises(SecAggError, match="unmask called when mask"):
        first.unmask({}, secagg.names)
    first.mask(np.zeros(3), 0.25, secagg.names, CLIP, secagg.scale, 32)
    with pytest.raises(SecAggError, match="mask called when unmask"):
        first.mask(np.zeros(3), 0.25, secagg.names, CLIP, secagg.scale, 32)


def test_a_client_refuses_keys_that_are_not_its_own() -> None:
    secagg = Round(NAMES[:4], 0)
    secagg.advertise(secagg.names)
    swapped = dict(secagg.keys)
    swapped["client-00"] = secagg.keys["client-01"]
    with pytest.raises(SecAggError, match="not its own"):
        secagg.clients["client-00"].share_keys(swapped, 0, THRESHOLD)


def test_a_client_refuses_a_u2_without_itself() -> None:
    secagg = Round(NAMES[:4], 0)
    secagg.advertise(secagg.names)
    secagg.share(secagg.names)
    with pytest.raises(SecAggError, match="client client-00: not in U2"):
        secagg.clients["client-00"].mask(np.zeros(3), 0.25, NAMES[1:4], CLIP, secagg.scale,
                                         32)


# --- uniformity of a masked input ---


def chi_square_survival(statistic: float, freedom: int) -> float:
    """P(X > statistic) for X chi-square with ``freedom`` degrees: the regularised upper
    incomplete gamma function Q(freedom / 2, statistic / 2), by its power series below
    a + 1 and by its continued fraction (Lentz's method) above."""
    a, x = freedom / 2, statistic / 2
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        for n in itertools.count(1):
            term *= x / (a + n)
            total += term
            if term < total * 1e-16:
                return max(0.0, 1 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in itertools.count(1):
        an, b = -i * (i - a), b + 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            return h * math.exp(log_front)
    raise AssertionError("unreachable")


@pytest.mark.parametrize(("statistic", "freedom", "expected"),
                         [(3.0, 2, math.exp(-1.5)), (40.0, 2, math.exp(-20)),
                          (0.5, 1, math.erfc(math.sqrt(0.25))),
                          (9.0, 1, math.erfc(math.sqrt(4.5))),
                          (255.0, 255, None), (330.0, 255, None)])
def test_the_chi_square_survival_function(statistic: float, freedom: int,
                                          expected: float | None) -> None:
    p = chi_square_survival(statistic, freedom)
    if expected is not None:  # closed forms for 1 and 2 degrees of freedom
        assert p == pytest.approx(expected, rel=1e-10)
    elif statistic == freedom:  # the median of chi-square(k) is near k (1 - 2 / 9k)^3
        assert 0.45 < p < 0.52
    else:  # 330 on 255 degrees: z = (330 - 255) / sqrt(510) = 3.3, p about 0.001
        assert 0.0005 < p < 0.002


def uniformity_p(ring_values: np.ndarray, bits: int, shift: int | None = None) -> float:
    """The chi-square test's p-value that 8 bits of ``ring_values`` (the top 8, or those
    from bit ``shift`` up) are uniform over their 256 bins."""
    shift = bits - 8 if shift is None else shift
    bins = np.bincount(((ring_values >> shift) & 0xFF).astype(np.int64), minlength=256)
    expected = ring_values.size / 256
    return chi_square_survival(float(np.sum((bins - expected) ** 2 / expected)), 255)


@pytest.fixture
def fixed_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients' keys and seeds from a fixed stream, so the uniformity test is the same
    test at every run rather than a test that fails one run in a thousand."""
    counter = itertools.count()

    def draw() -> bytes:
        return hashlib.sha256(b"secagg test %d" % next(counter)).digest()

    monkeypatch.setattr(client_module.secrets, "token_bytes", lambda n: draw()[:n])
    monkeypatch.setattr(keys_module, "generate", lambda: keys_module.private_from_bytes(draw()))


@pytest.mark.usefixtures("fixed_secrets")
@pytest.mark.parametrize("update", ["zeros", "gaussian"])
@pytest.mark.parametrize("bits", [16, 32])  # 32: the default ring
def test_a_masked_input_is_uniform_and_the_unmasked_one_is_not(update: str, bits: int) -> None:
    size = 10**5
    values = (np.zeros(size) if update == "zeros"
              else np.random.default_rng(4).normal(0, 0.3, size))
    secagg = Round(NAMES[:3], 0, bits)
    secagg.advertise(secagg.names)
    secagg.share(secagg.names)
    masked, _ = secagg.clients["client-00"].mask(values, 1.0, secagg.names, CLIP,
                                                 secagg.scale, bits)
    for shift in (bits - 8, (bits - 8) // 2, 0):  # the top, middle and lowest 8 bits
        assert uniformity_p(masked, bits, shift) > 0.001, shift
    quantized, _ = quantize(values, 1.0, CLIP, secagg.scale, bits)
    assert uniformity_p(quantized, bits) < 0.001  # the negative control
