"""Codecs and aggregation rules of one's own: registered by name or named as plug-ins
(``module:attribute``), they go through the same seams as the built-in ones."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training import aggregation, codecs
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.algorithms.config_checks import split_aggregation
from thrift_trainer.training.compression import (
    CompressionSettings,
    check_supported,
    compress,
    compress_update,
    decompress,
    settings_from,
)
from thrift_trainer.training.plugins import allow
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict

# A plug-in codec: each tensor rounded to one decimal, sent as float32 (the rounding
# error is what error feedback keeps).
MY_CODECS = """
import numpy as np
import thrift_trainer as tt


class Tenths(tt.Codec):
    name = "tenths"
    error_feedback = True

    def encode(self, value):
        return {"tenths": np.round(value * 10).astype(np.float32)}

    def decode(self, name, parts):
        if set(parts) != {"tenths"}:
            raise ValueError(f"tensor {name!r}: tenths needs one part")
        return parts["tenths"].astype(np.float64) / 10


class Rounded(Tenths):
    name = "rounded"
    error_feedback = False


def not_a_codec():
    pass
"""
# Plug-in aggregation rules: the first update, and one that reads its settings.
MY_RULES = """
def first(updates, samples):
    return dict(updates[0])


def heaviest(updates, samples, settings):
    return dict(updates[max(range(len(samples)), key=samples.__getitem__)])


NOT_A_RULE = 3
"""
UPDATES = [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}]


@pytest.fixture
def own_codecs(plugin_module, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codecs, "_REGISTRY", dict(codecs._REGISTRY))
    allow(["my_codecs"], plugin_module("my_codecs", MY_CODECS))


@pytest.fixture
def own_rules(plugin_module, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregation, "RULES", dict(aggregation.RULES))
    allow(["my_rules"], plugin_module("my_rules", MY_RULES))


# --------------------------------------------------------------------------- codecs
def test_a_plugin_codec_travels_under_its_name_and_decodes_itself(own_codecs) -> None:
    update = {"w": np.array([0.123, -1.26]), "steps": np.array([3], dtype=np.int64)}
    payload, _ = compress(update, "my_codecs:Tenths")
    assert sorted(payload) == ["steps", "w#my_codecs:Tenths#tenths"]
    decoded = decompress(wire_to_dict(dict_to_wire(payload)))
    np.testing.assert_allclose(decoded["w"], [0.1, -1.3])
    assert decoded["steps"].tolist() == [3]
    with pytest.raises(ValueError, match="tenths needs one part"):
        decompress({"w#my_codecs:Tenths#other": np.zeros(2, np.float32)})


def test_a_plugin_codec_keeps_error_feedback_on_the_node(own_codecs) -> None:
    """What the codec leaves out stays in the node's session and goes with the next
    update of the slot: sent + residual == the raw updates' sum."""
    settings = CompressionSettings(up="my_codecs:Tenths")
    assert settings.keeps_residuals
    store = SessionStore()
    sent = np.zeros(2)
    for _ in range(3):
        sent += decompress(compress_update({"w": np.array([0.04, 0.26])}, settings, store,
                                           "run1", "slot1"))["w"]
    with store.use("run1", "residual/slot1") as session:
        residual = session.state.tensors["w"]
    np.testing.assert_allclose(sent, [0.1, 0.8])  # 0.12 and 0.78 without the feedback
    np.testing.assert_allclose(sent + residual, [0.12, 0.78])


def test_a_registered_codec_is_usable_by_its_plain_name(own_codecs) -> None:
    tenths = codecs.codec_class("my_codecs:Tenths")
    codecs.register_codec(type("Halves", (tenths,), {"name": "halves",
                                                     "directions": frozenset({"up", "down"})}))
    assert "halves" in codecs.known_codecs("down")
    assert settings_from({"up": "halves"}).up == "halves"
    payload, _ = compress({"w": np.array([0.5])}, "halves")
    assert list(payload) == ["w#halves#tenths"] and decompress(payload)["w"].tolist() == [0.5]
    with pytest.raises(TypeError, match="not a Codec subclass"):
        codecs.register_codec(dict)
    with pytest.raises(ValueError, match="cannot hold '#'"):
        codecs.register_codec(type("Bad", (tenths,), {"name": "a#b"}))


@pytest.mark.parametrize(("name", "words"), [
    ("my_codecs:not_a_codec", "not_a_codec is a function, not a class"),
    ("my_codecs:Missing", "has no attribute 'Missing'"),
    ("other_codecs:Tenths", "lacks plug-in other_codecs: it allows my_codecs; start it with "
                            "--plugins my_codecs,other_codecs"),
])
def test_a_plugin_codec_that_cannot_be_used_is_refused_naming_it(own_codecs, name,
                                                                 words) -> None:
    with pytest.raises(ConfigError, match=f"compression.up: unknown codec '{name}'") as bad:
        settings_from({"up": name})
    assert words in str(bad.value)


def test_error_feedback_codecs_go_only_where_topk_goes(own_codecs) -> None:
    feedback = CompressionSettings(up="my_codecs:Tenths")
    for name, model in (("delta_avg", "mlp_classifier"), ("sync_sgd", "mlp")):
        check_supported(feedback, name, get_algorithm(name).compression_codecs(model))
    # FL-GAN's updates are whole model states, which do not add up over rounds
    fl_gan = get_algorithm("fl_gan").compression_codecs("dcgan28-tiny")
    with pytest.raises(ConfigError, match="fl_gan cannot use 'my_codecs:Tenths'"):
        check_supported(feedback, "fl_gan", fl_gan)
    check_supported(CompressionSettings(up="my_codecs:Rounded"), "fl_gan", fl_gan)


# ---------------------------------------------------------------- aggregation rules
def test_a_plugin_rule_combines_the_round(own_rules) -> None:
    settings = aggregation.check_settings({"rule": "my_rules:first"})
    assert aggregation.aggregate(settings, UPDATES, [1, 5])["w"].tolist() == [1.0, 2.0]
    settings = aggregation.check_settings({"rule": "my_rules:heaviest"})
    assert aggregation.aggregate(settings, UPDATES, [1, 5])["w"].tolist() == [3.0, 6.0]


def test_register_aggregation_makes_a_plain_name(own_rules) -> None:
    def scaled(updates, samples, settings):
        return {"w": updates[0]["w"] * settings["trim_fraction"]}

    aggregation.register_aggregation("scaled", scaled)
    settings = aggregation.check_settings({"rule": "scaled", "trim_fraction": 0.25})
    assert aggregation.aggregate(settings, UPDATES, [1, 1])["w"].tolist() == [0.25, 0.5]
    with pytest.raises(ValueError, match="must be plain"):
        aggregation.register_aggregation("my_rules:scaled", scaled)


@pytest.mark.parametrize(("rule", "words"), [
    ("my_rules:NOT_A_RULE", "aggregation rule my_rules:NOT_A_RULE: a run may name only an "
                            "aggregation rule my_rules defines itself (first, heaviest); "
                            "NOT_A_RULE is an int, not a function"),
    ("my_rules:missing", "has no attribute 'missing'"),
    ("their_rules:first", "lacks plug-in their_rules: it allows my_rules; start it with "
                          "--plugins my_rules,their_rules"),
    ("geometric", "must be one of mean, median, trimmed_mean, krum or a plug-in"),
])
def test_a_rule_that_cannot_be_used_is_refused_naming_the_key(own_rules, rule,
                                                              words) -> None:
    with pytest.raises(ConfigError) as bad:
        split_aggregation({"aggregation": {"rule": rule}})
    assert "'aggregation.rule'" in str(bad.value) and words in str(bad.value)

