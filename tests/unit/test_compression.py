"""Update and weight codecs against plain numpy, error feedback, and settings checks."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.compute_node.sessions import SessionStore
from thrift_trainer.training.algorithms import ConfigError, get_algorithm
from thrift_trainer.training.compression import (
    NONE,
    CompressionSettings,
    check_supported,
    compress,
    compress_update,
    decompress,
    encode_weights,
    join_config,
    settings_from,
    split_config,
)
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict


def _update(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W": rng.normal(size=(30, 20)).astype(np.float32),
            "b": rng.normal(size=(20,)).astype(np.float64),
            "steps": np.array([7], dtype=np.int64)}


def _through_wire(payload: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return decompress(wire_to_dict(dict_to_wire(payload)))


def test_none_sends_the_update_unchanged() -> None:
    update = _update()
    payload, residual = compress(update, "none")
    assert residual is None
    assert list(payload) == list(update)
    assert all(payload[k] is update[k] for k in update)
    decoded = _through_wire(payload)
    assert all(np.array_equal(decoded[k], update[k]) for k in update)


def test_fp16_matches_numpy_and_keeps_dtypes() -> None:
    update = _update()
    decoded = _through_wire(compress(update, "fp16")[0])
    for name, value in update.items():
        assert decoded[name].dtype == value.dtype and decoded[name].shape == value.shape
        expected = value.astype(np.float16).astype(value.dtype) if value.dtype.kind == "f" \
            else value
        assert np.array_equal(decoded[name], expected)


def test_int8_error_is_at_most_half_a_step_of_its_per_tensor_scale() -> None:
    update = _update(1)
    payload = compress(update, "int8")[0]
    assert payload["W#int8#q"].dtype == np.int8
    decoded = _through_wire(payload)
    for name in ("W", "b"):
        value = update[name]
        scale = np.max(np.abs(value)) / 127
        assert decoded[name].dtype == value.dtype
        assert np.max(np.abs(decoded[name] - value)) <= scale / 2 * (1 + 1e-5)
        # the largest entry is exact up to rounding, so the scale is used in full
        peak = np.argmax(np.abs(value))
        assert abs(decoded[name].flat[peak]) == pytest.approx(abs(value.flat[peak]), rel=1e-6)
    assert np.array_equal(decoded["steps"], update["steps"])


def test_int8_of_a_zero_tensor_and_of_nan() -> None:
    zeros = {"z": np.zeros((4, 4), np.float32)}
    assert np.array_equal(_through_wire(compress(zeros, "int8")[0])["z"], zeros["z"])
    spoiled = {"x": np.array([1.0, np.nan, 2.0], np.float32)}
    assert not np.all(np.isfinite(_through_wire(compress(spoiled, "int8")[0])["x"]))


def test_topk_sends_the_largest_entries_by_magnitude() -> None:
    update = _update(2)
    payload, residual = compress(update, "topk", 0.05)
    w = update["W"]
    k = int(np.ceil(0.05 * w.size))
    assert payload["W#topk#values"].size == k
    expected = np.sort(np.argsort(-np.abs(w.reshape(-1)), kind="stable")[:k])
    assert np.array_equal(payload["W#topk#indices"], expected)
    decoded = _through_wire(payload)
    reference = np.zeros_like(w).reshape(-1)
    reference[expected] = w.reshape(-1)[expected]
    assert np.array_equal(decoded["W"], reference.reshape(w.shape))
    assert decoded["W"].dtype == np.float32 and decoded["b"].dtype == np.float64
    assert np.array_equal(decoded["W"] + residual["W"], w)


def test_topk_at_least_one_entry_and_whole_when_nothing_is_left_out() -> None:
    payload, _ = compress({"v": np.array([0.1, -3.0, 2.0])}, "topk", 0.01)
    assert payload["v#topk#values"].tolist() == [-3.0]
    whole, residual = compress({"v": np.array([0.1, -3.0])}, "topk", 1.0)
    assert list(whole) == ["v"] and not residual["v"].any()


def test_error_feedback_sends_everything_over_the_rounds() -> None:
    """Sum of what was sent + the final residual == sum of the raw updates."""
    store = SessionStore()
    settings = CompressionSettings(up="topk", topk_fraction=0.02)
    raw_sum = np.zeros((30, 20), np.float64)
    sent_sum = np.zeros((30, 20), np.float64)
    for round_index in range(12):
        update = _update(round_index)
        raw_sum += update["W"]
        payload = compress_update(update, settings, store, "run1", "u3")
        sent_sum += decompress(payload)["W"]
    with store.use("run1", "residual/u3") as session:
        residual = session.state.tensors["W"]
    np.testing.assert_allclose(sent_sum + residual, raw_sum, rtol=0, atol=1e-4)
    # without feedback, the same rounds would have lost most of the mass
    assert np.abs(residual).sum() < np.abs(raw_sum).sum()


def test_error_feedback_is_kept_per_run_and_slot() -> None:
    store = SessionStore()
    settings = CompressionSettings(up="topk", topk_fraction=0.5)
    update = {"v": np.array([1.0, 0.5], np.float64)}
    compress_update(update, settings, store, "run1", "a")
    # another slot starts with no residual: 1.0 wins again
    assert decompress(compress_update(update, settings, store, "run1", "b"))["v"].tolist() \
        == [1.0, 0.0]
    # slot a adds its residual 0.5: 0.5 + 0.5 = 1.0 ties 1.0 + 0, both kept, one sent
    second = decompress(compress_update(update, settings, store, "run1", "a"))["v"]
    assert second.sum() == pytest.approx(1.0)


def test_warmup_sends_a_denser_share_in_the_first_rounds() -> None:
    """Round r of the warm-up: max(fraction, 0.25 ** r) of each tensor (DGC's schedule)."""
    settings = CompressionSettings(up="topk", topk_fraction=0.01, topk_warmup_rounds=4)
    assert [settings.fraction_at(r) for r in range(1, 7)] == [0.25, 0.0625, 0.015625, 0.01,
                                                             0.01, 0.01]
    assert CompressionSettings(up="topk", topk_fraction=0.1,
                               topk_warmup_rounds=4).fraction_at(2) == 0.1
    assert CompressionSettings(up="topk").fraction_at(1) == 0.01  # no warm-up by default


def test_warmup_rounds_keep_error_feedback_exact() -> None:
    """Each round sends the top max(fraction, 0.25 ** r) of update + residual (numpy
    reference), and what was sent + the residual still adds up to the raw updates."""
    store = SessionStore()
    settings = CompressionSettings(up="topk", topk_fraction=0.01, topk_warmup_rounds=3)
    raw_sum = np.zeros(400)
    sent_sum = np.zeros(400)
    residual = np.zeros(400)
    for round_index in range(1, 6):
        update = np.random.default_rng(round_index).normal(size=400)
        raw_sum += update
        sent = decompress(compress_update({"x": update}, settings, store, "run1", "u",
                                          round_index))["x"]
        k = int(np.ceil(max(0.01, 0.25 ** round_index) * 400)) if round_index <= 3 else 4
        total = update + residual
        expected = np.zeros(400)
        top = np.argsort(-np.abs(total))[:k]
        expected[top] = total[top]
        np.testing.assert_allclose(sent, expected, rtol=0, atol=1e-12)
        residual = total - expected
        sent_sum += sent
    with store.use("run1", "residual/u") as session:
        np.testing.assert_allclose(session.state.tensors["x"], residual, atol=1e-12)
    np.testing.assert_allclose(sent_sum + residual, raw_sum, atol=1e-9)


def test_a_spoiled_residual_is_not_kept() -> None:
    payload, residual = compress({"x": np.array([np.nan, np.inf, 1.0, 2.0])}, "topk", 0.25)
    assert not np.isfinite(payload["x#topk#values"]).all()  # sent, so the update is refused
    assert "x" not in residual


def test_weights_down_in_fp16() -> None:
    weights = _update(3)
    assert encode_weights(weights, NONE) == weights
    down = encode_weights(weights, CompressionSettings(down="fp16"))
    decoded = _through_wire(down)
    assert decoded["W"].dtype == np.float32
    assert np.array_equal(decoded["W"], weights["W"].astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("payload, fragment", [
    ({"w#topk#values": np.ones(2, np.float32), "w#topk#indices": np.array([0, 9], np.int32),
      "w#topk#shape": np.array([3], np.int64)}, "out of range"),
    ({"w#topk#values": np.ones(2, np.float32), "w#topk#indices": np.array([1, 1], np.int32),
      "w#topk#shape": np.array([3], np.int64)}, "repeat"),
    ({"w#topk#values": np.ones(1, np.float32), "w#topk#indices": np.array([0], np.int32),
      "w#topk#shape": np.array([1 << 40], np.int64)}, "too large"),
    ({"w#int8#q": np.ones(2, np.int8)}, "not a known compressed form"),
    ({"w#zip#x": np.ones(2, np.float32)}, "not a known compressed form"),
    ({"w#fp16#int64": np.ones(2, np.float16)}, "cannot restore"),
    ({"w": np.ones(2), "w#fp16#float32": np.ones(2, np.float16)}, "both plain and compressed"),
])
def test_malformed_payloads_are_refused(payload: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        decompress(payload)


@pytest.mark.parametrize("raw, fragment", [
    ({"up": "zip"}, "compression.up: unknown codec 'zip'"),
    ({"down": "int8"}, "compression.down: unknown codec 'int8'"),
    ({"up": "topk", "topk_fraction": 0}, "compression.topk_fraction"),
    ({"up": "topk", "topk_fraction": 1.5}, "compression.topk_fraction"),
    ({"upp": "fp16"}, "compression.upp"),
    ({"up": "topk", "topk_warmup_rounds": -1}, "compression.topk_warmup_rounds"),
    ({"up": "topk", "topk_warmup_rounds": 2.0}, "compression.topk_warmup_rounds"),
])
def test_bad_settings_name_the_key(raw: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        settings_from(raw)


def test_settings_travel_in_the_config_only_when_on() -> None:
    config, settings = split_config({"eta": 0.1})
    assert settings == NONE and join_config(config, settings) == {"eta": 0.1}
    on = settings_from({"up": "topk", "topk_fraction": 1, "topk_warmup_rounds": 3})
    joined = join_config(config, on)
    assert split_config(joined) == (config, on)


@pytest.mark.parametrize("algorithm, model, settings, fragment", [
    ("md_gan", "dcgan28-tiny", CompressionSettings(up="fp16"), "compression.up: md_gan"),
    ("md_gan", "dcgan28-tiny", CompressionSettings(down="fp16"), "compression.down: md_gan"),
    ("fl_gan", "dcgan28-tiny", CompressionSettings(up="topk"), "compression.up: fl_gan"),
    ("sync_sgd", "dcgan28-tiny", CompressionSettings(up="topk"), "compression.up: sync_sgd"),
])
def test_algorithms_refuse_codecs_they_cannot_use(algorithm: str, model: str,
                                                   settings: CompressionSettings,
                                                   fragment: str) -> None:
    cls = get_algorithm(algorithm)
    with pytest.raises(ConfigError, match=fragment):
        check_supported(settings, cls.name, cls.compression_codecs(model))


def test_averaging_algorithms_accept_every_codec() -> None:
    for name, model in (("delta_avg", "mlp"), ("sync_sgd", "mlp")):
        cls = get_algorithm(name)
        for up in ("fp16", "int8", "topk"):
            check_supported(CompressionSettings(up=up, down="fp16"), cls.name,
                            cls.compression_codecs(model))


def test_sync_sgd_residuals_follow_the_unit_slot() -> None:
    from thrift_trainer.training.units import UnitSpec
    cls = get_algorithm("sync_sgd")
    config = {"units_per_iteration": 4}
    slots = [cls.unit_slot(UnitSpec(f"unit{n}-0-320", "f"), config) for n in (1, 5, 9, 2)]
    assert slots[:3] == ["slot1"] * 3 and slots[3] == "slot2"


def test_a_node_sends_topk_with_feedback_and_takes_fp16_weights() -> None:
    """The node's hooks: fp16 weights decoded for the maths, the update sent as topk and
    what was left out kept under the run and unit for the next update."""
    import json

    from thrift_trainer.compute_node.handler import ComputeNodeHandler
    from thrift_trainer.compute_node.load import LoadSimulator
    from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
    from thrift_trainer.training.models import mlp
    from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes

    weights = mlp.init_params(mlp.MLPSpec(hidden=(20,)))
    settings = CompressionSettings(up="topk", down="fp16", topk_fraction=0.1)
    config = join_config({"epochs": 2, "eta": 0.0001, "hidden": [20]}, settings)
    node = ComputeNodeHandler("n1", DEFAULT_DATA_ROOT, LoadSimulator(0.0, 0.0, seed=1))
    result = node.train_with_weights(ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u1", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters",
        unit_path="train_letters1.txt", config_json=json.dumps(config),
        weights=dict_to_wire(encode_weights(weights, settings)), scheduling_policy=2))
    assert result.outcome == ttypes.UnitOutcome.COMPLETED
    payload = wire_to_dict(result.update)
    assert set(payload) == {f"{n}#topk#{p}" for n in ("W", "V")
                            for p in ("values", "indices", "shape")}
    update = decompress(payload)
    assert update["W"].shape == weights["W"].shape and update["W"].dtype == weights["W"].dtype
    assert np.count_nonzero(update["W"]) <= np.ceil(0.1 * weights["W"].size)
    with node.sessions.use("r", "residual/u1") as session:
        assert np.abs(session.state.tensors["W"]).sum() > 0


def test_the_run_config_sends_compression_only_when_a_codec_is_on() -> None:
    from thrift_trainer.training.run_config import RunConfigError, load_run_config

    plain = load_run_config(None, [])
    assert "compression" not in plain.algorithm_config()
    on = load_run_config(None, ["compression.up=topk", "compression.topk_fraction=0.05"])
    sent = on.algorithm_config()["compression"]
    assert sent == {"up": "topk", "down": "none", "topk_fraction": 0.05,
                    "topk_warmup_rounds": 0}
    assert split_config(on.algorithm_config())[1] == settings_from(sent)
    with pytest.raises(RunConfigError, match="compression.topk_fraction must be a number"):
        load_run_config(None, ["compression.topk_fraction=lots"])


def test_an_error_feedback_codec_sends_a_state_whole_and_keeps_no_residual_of_it() -> None:
    update = {"w": np.arange(100, dtype=np.float32), "buffer.bn.running_mean":
              np.arange(100, dtype=np.float32)}
    payload, residual = compress(update, "topk", 0.05)
    assert np.array_equal(payload["buffer.bn.running_mean"], update["buffer.bn.running_mean"])
    assert "w" not in payload and set(residual) == {"w"}
