"""Secure aggregation joined to the trainer: the run's section and what it refuses, a
node's store of its clients' round secrets (what a peer can make it keep, what it refuses
out of order), the phases' messages, and distributed DP's noise shared out among the
clients."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from thrift_trainer.compute_node.secure_clients import SecureClients
from thrift_trainer.coordinator.records import InvalidRun, RunRequest
from thrift_trainer.coordinator.request_checks import RequestLimits
from thrift_trainer.coordinator.run_setup import prepare
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.privacy import distributed
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.schema import PrivacySettings, SecureAggregationSettings
from thrift_trainer.training.secure_aggregation import messages, quantize, ring
from thrift_trainer.training.secure_aggregation.errors import SecAggError
from thrift_trainer.training.secure_aggregation.server import unmask_sum
from thrift_trainer.training.secure_aggregation.settings import settings_from

DATA = Path(__file__).resolve().parents[2] / "data"
FEDERATED = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
             "delta_avg.local_optimizer=sgd", "clients.count=10", "clients.per_round=3"]
SECURE = [*FEDERATED, "secure_aggregation.enabled=true"]
ON = SecureAggregationSettings(enabled=True, threshold=0.6)
OFF_PRIVACY = PrivacySettings()


# ------------------------------------------------------------------- settings
@pytest.mark.parametrize("raw, why", [
    ({"enabled": True, "bits": 4}, "secure_aggregation.bits must be in 8..62"),
    ({"enabled": True, "bits": 63}, "secure_aggregation.bits must be in 8..62"),
    ({"enabled": True, "threshold": 0.5}, r"threshold must be in \(0.5, 1\]"),
    ({"enabled": True, "neighbours": -2}, "neighbours must be >= 0"),
    ({"enabled": True, "clip_range": 0.0}, "clip_range must be a finite number > 0"),
    ({"bits": 16}, "set secure_aggregation.enabled: true"),
    ({"enabled": True, "bitz": 16}, "unknown key 'secure_aggregation.bitz'"),
])
def test_bad_secure_aggregation_settings_are_refused_naming_the_key(raw, why):
    with pytest.raises(ConfigError, match=why):
        settings_from(raw)


def test_a_run_without_secure_aggregation_sends_what_it_sent_before():
    config = load_run_config(None, FEDERATED).to_spec().config_dict(with_schedule=True)
    assert "secure_aggregation" not in config
    config = load_run_config(None, SECURE).to_spec().config_dict(with_schedule=True)
    assert config["secure_aggregation"]["enabled"] is True


def _prepare(overrides: list[str]):
    config = load_run_config(None, overrides)
    spec = config.to_spec()
    request = RunRequest("r1", spec.algorithm, spec.model, spec.dataset, 2,
                         json.dumps(config.algorithm_config()), None)
    return prepare(request, DATA, RequestLimits(), deterministic=False)


@pytest.mark.parametrize("overrides, why", [
    (["secure_aggregation.enabled=true"], "needs federated clients"),
    ([*SECURE, "schedule.mode=buffered"], "'buffered' mode applies single results"),
    ([*SECURE, "aggregation.rule=median"], "aggregation.rule median needs each update"),
    ([*SECURE, "compression.up=fp16"], "masked updates cannot be compressed"),
    ([*SECURE, "privacy.clip=1.0", "privacy.noise_multiplier=1.0"],
     "set secure_aggregation.noise_clients"),
    ([*SECURE, "privacy.clip=1.0", "privacy.noise_multiplier=1.0",
      "privacy.adaptive_clip_quantile=0.5", "secure_aggregation.noise_clients=3"],
     "adaptive clipping counts the updates under the clip"),
    ([*SECURE, "run.algorithm=sync_sgd", "sync_sgd.num_workunits_per_update=3",
      "sync_sgd.units_per_iteration=3"], "sync_sgd cannot sum its clients' updates"),
])
def test_what_cannot_be_summed_securely_is_refused_before_round_1(overrides, why):
    with pytest.raises(InvalidRun, match=f"secure_aggregation: .*{why}"):
        _prepare(overrides)


def test_a_secure_run_and_a_private_secure_run_are_accepted():
    _prepare(SECURE)
    _prepare([*SECURE, "privacy.clip=1.0", "privacy.noise_multiplier=1.0",
              "secure_aggregation.noise_clients=3"])


# ---------------------------------------------------------- a node's secrets
def _ask(node: SecureClients, kind: str, client: str, round_index: int = 1,
         run: str = "run1", **data) -> dict:
    raw = messages.encode({"context": f"{run}/{round_index}/abc", **data})
    return json.loads(node.phase(kind, run, round_index, client, raw, ON))


def test_a_round_through_two_nodes_stores_sums_to_the_weighted_updates():
    """Four clients on two nodes, one dropping after sharing its keys."""
    nodes = {"a": SecureClients(), "b": SecureClients()}
    home = {"c1": "a", "c2": "a", "c3": "b", "c4": "b"}
    keys = {client: _ask(nodes[node], messages.KEYS, client) for client, node in home.items()}
    table = {client: [pair["c"], pair["s"]] for client, pair in keys.items()}
    sealed = {client: messages.byte_map(_ask(nodes[node], messages.SHARES, client,
                                             keys=table, u1=sorted(table))["sealed"],
                                        "sealed")
              for client, node in home.items()}
    rng = np.random.default_rng(3)
    updates = {client: {"w": rng.normal(0, 0.1, (2, 3)), "b": rng.normal(0, 0.1, 3)}
               for client in home}
    weights = {"c1": 0.1, "c2": 0.2, "c3": 0.3, "c4": 0.4}
    scale = quantize.scale_for(ON.clip_range, ON.bits, 4)
    u3 = ["c1", "c2", "c3"]  # c4 shared its keys and never sent its update
    masked = []
    for client in u3:
        raw = messages.encode({"context": "run1/1/abc", "u2": sorted(home),
                               "weight": weights[client], "scale": scale})
        out = nodes[home[client]].mask("run1", 1, client, raw, updates[client], ON,
                                       OFF_PRIVACY)
        assert out["w"].dtype == messages.wire_dtype(ON.bits) and out["w"].shape == (2, 3)
        masked.append(np.concatenate([out["b"].ravel(), out["w"].ravel()])
                      .view(ring.ring_dtype(ON.bits)))
    revealed = {}
    for client in u3:
        to_me = {sender: messages.to_text(by[client]) for sender, by in sealed.items()
                 if client in by}
        answer = _ask(nodes[home[client]], messages.UNMASK, client, u3=u3, sealed=to_me)
        revealed[client] = {owner: (kind, messages.from_text(share))
                            for owner, (kind, share) in answer["revealed"].items()}
    pairs = {client: (messages.from_text(pair[0]), messages.from_text(pair[1]))
             for client, pair in table.items()}
    total = unmask_sum(masked, pairs, set(home), set(u3), revealed, ON.neighbours,
                       ON.threshold, b"run1/1/abc", ON.bits)
    expected = sum(weights[c] * np.concatenate([updates[c]["b"], updates[c]["w"].ravel()])
                   for c in u3)
    np.testing.assert_allclose(quantize.dequantize(total, scale, ON.bits), expected,
                               rtol=0, atol=quantize.error_bound(4, scale) + 1e-12)
    assert len(nodes["a"]) == 0 and len(nodes["b"]) == 1  # the unmasked spend theirs


def test_phases_out_of_order_or_of_another_round_are_refused():
    node = SecureClients()
    with pytest.raises(SecAggError, match="holds no secrets of c1"):
        _ask(node, messages.SHARES, "c1", keys={}, u1=[])
    _ask(node, messages.KEYS, "c1")
    with pytest.raises(SecAggError, match="not one of run run1 round 2"):
        node.phase(messages.SHARES, "run1", 2, "c1",
                   messages.encode({"context": "run1/1/abc", "keys": {}}), ON)
    with pytest.raises(SecAggError, match="holds no secrets of c1"):
        _ask(node, messages.SHARES, "c1", run="run2", keys={}, u1=[])
    with pytest.raises(SecAggError, match="not JSON"):
        node.phase(messages.SHARES, "run1", 1, "c1", b"{nope", ON)
    with pytest.raises(SecAggError, match="lacks context"):
        node.phase(messages.KEYS, "run1", 1, "c1", messages.encode({}), ON)
    with pytest.raises(SecAggError, match="weight must be a positive number"):
        node.mask("run1", 1, "c1", messages.encode({
            "context": "run1/1/abc", "u2": ["c1"], "weight": "x", "scale": 1.0}),
            {"w": np.zeros(2)}, ON, OFF_PRIVACY)


def test_what_a_peer_can_make_a_node_keep_is_bounded_in_count_and_time():
    node = SecureClients(max_held=3)
    for k in range(5):
        _ask(node, messages.KEYS, f"c{k}")
    assert len(node) == 3
    with pytest.raises(SecAggError, match="holds no secrets of c0"):  # the oldest went
        _ask(node, messages.SHARES, "c0", keys={}, u1=[])
    stale = SecureClients(held_seconds=0.0)
    _ask(stale, messages.KEYS, "c1")
    with pytest.raises(SecAggError, match="holds no secrets of c1"):
        _ask(stale, messages.SHARES, "c1", keys={}, u1=[])


# ---------------------------------------------------------- distributed DP
def test_each_client_clips_its_update_and_adds_its_share_of_the_noise():
    settings = PrivacySettings(clip=2.0, noise_multiplier=1.5)
    assert distributed.client_noise_std(settings, 9) == pytest.approx(1.0)
    quiet = distributed.privatized({"w": np.full(4, 10.0)}, PrivacySettings(clip=2.0), 9)
    assert np.linalg.norm(quiet["w"]) == pytest.approx(2.0)  # clipped, no noise
    noised = distributed.privatized({"w": np.zeros(200_000)}, settings, 9)["w"]
    assert noised.std() == pytest.approx(1.0, rel=0.02)
    again = distributed.privatized({"w": np.zeros(8)}, settings, 9)["w"]
    assert not np.array_equal(again, distributed.privatized({"w": np.zeros(8)},
                                                            settings, 9)["w"])


def test_the_coordinator_adds_only_the_noise_too_few_clients_left_short():
    settings = PrivacySettings(clip=2.0, noise_multiplier=1.5)
    assert distributed.shortfall_std(settings, 4, 4) == 0.0
    assert distributed.shortfall_std(settings, 4, 6) == 0.0
    # 1 of 4: the client's variance (z c)^2 / 4 plus the top-up's is (z c)^2
    top_up = distributed.shortfall_std(settings, 4, 1)
    assert top_up ** 2 + distributed.client_noise_std(settings, 4) ** 2 == \
        pytest.approx((1.5 * 2.0) ** 2)
