"""training/payload_checks.py: a payload's codec, tensors and decoded size, checked before
anything of it is decoded."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.training.codecs import Codec, TopK
from thrift_trainer.training.compression import compress
from thrift_trainer.training.payload_checks import PayloadForm, check_payload

WEIGHTS = {"w": np.ones((40, 30)), "b": np.ones(30)}
SPECS = {name: (value.shape, value.dtype) for name, value in WEIGHTS.items()}


def form(codec: str, tensors: bool = True) -> PayloadForm:
    return PayloadForm.of_model(codec, SPECS if tensors else None, WEIGHTS)


def topk_claiming(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {"w#topk#values": np.ones(2), "w#topk#indices": np.arange(2, dtype=np.int32),
            "w#topk#shape": np.asarray(shape, dtype=np.int64), "b": np.ones(30)}


@pytest.mark.parametrize("codec", ["none", "fp16", "int8", "topk"])
def test_what_the_run_asked_for_passes(codec: str) -> None:
    check_payload(compress(WEIGHTS, codec, 0.1)[0], form(codec))


@pytest.mark.parametrize("sent, asked", [("topk", "none"), ("int8", "fp16"), ("fp16", "topk")])
def test_a_codec_the_run_did_not_ask_for_is_refused(sent: str, asked: str) -> None:
    with pytest.raises(ValueError, match=f"compressed with '{sent}', not asked for"):
        check_payload(compress(WEIGHTS, sent, 0.1)[0], form(asked))


def test_tensors_that_are_not_the_models_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['x'\]"):
        check_payload({"w": WEIGHTS["w"], "x": np.ones(3)}, form("none"))


@pytest.mark.parametrize("payload", [
    topk_claiming((1 << 40,)),
    {"w#int8#q": np.ones((4000, 30), np.int8), "w#int8#scale": np.asarray(1.0), "b": np.ones(30)},
    {"w#fp16#float64": np.ones(7, np.float16), "b": np.ones(30)},
    {"w": np.ones((30, 40)), "b": np.ones(30)},
])
def test_a_shape_other_than_the_models_is_refused_before_decoding(
        payload: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TopK, "decode", lambda *args: pytest.fail("decoded"))
    codec = next((key.split("#")[1] for key in payload if "#" in key), "none")
    verb = "claims" if codec != "none" else "has"
    with pytest.raises(ValueError, match=rf"tensor 'w' {verb} shape \("):
        check_payload(payload, form(codec))


def test_without_known_tensors_the_model_size_bounds_what_decodes() -> None:
    check_payload(topk_claiming((40, 30)), form("topk", tensors=False))
    with pytest.raises(ValueError, match="claim 1231 entries in all, more than the model's 1230"):
        check_payload(topk_claiming((1231,)), form("topk", tensors=False))


def test_a_malformed_shape_part_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative int64 sizes"):
        check_payload(topk_claiming((-1,)), form("topk"))


def test_a_hostile_shape_is_shown_shortened() -> None:
    with pytest.raises(ValueError) as refused:
        check_payload(topk_claiming((1,) * 10_000), form("topk"))
    assert "10000 sizes" in str(refused.value) and len(str(refused.value)) < 200


class Opaque(Codec):
    """A codec that cannot tell a shape before decoding (the default)."""

    name = "opaque"


def test_a_codec_that_cannot_tell_its_shape_is_left_to_the_checks_after_decoding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("thrift_trainer.training.payload_checks.codec_class", lambda name: Opaque)
    check_payload({"w#opaque#bits": np.ones(3, np.uint8), "b": np.ones(30)}, form("opaque"))
