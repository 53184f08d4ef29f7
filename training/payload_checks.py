"""What a payload from the network may decode to, checked before anything of it is decoded.

A payload (training/compression.py) holds plain tensors and compressed ones, whose parts
are named ``<tensor>#<codec>#<part>``. Decoding expands: a topk part names the dense shape
it fills, int8 and fp16 widen their values, so a few MiB could claim GiBs. `check_payload`
refuses, without decoding, a payload

* holding a tensor compressed with another codec than the one the run asked for in that
  direction (with ``none``, no compressed tensor at all);
* whose tensors are not the expected ones, when the receiver knows them: their names, and
  their shapes as sent or as their codec claims them (`Codec.decoded_shape`);
* whose compressed tensors would decode to more entries than the model has.

A codec that cannot tell a shape before decoding (a plug-in's `decoded_shape` returning
None) leaves that tensor to the receiver's checks after decoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from thrift_trainer.training.codecs import SEP, codec_class
from thrift_trainer.training.units import TensorSpecs

Groups = dict[str, dict[str, np.ndarray]]  # tensor name -> {"<codec>#<part>": array}


@dataclass(frozen=True)
class PayloadForm:
    """What a payload may hold: compressed tensors only in ``codec`` ("none": none at all),
    exactly the ``tensors`` expected (when known), and compressed tensors of at most
    ``max_decoded`` entries in all (when known)."""

    codec: str = "none"
    tensors: TensorSpecs | None = None
    max_decoded: int | None = None

    @classmethod
    def of_model(cls, codec: str, tensors: TensorSpecs | None,
                 weights: Mapping[str, np.ndarray]) -> PayloadForm:
        """The form of an update or weights of a model whose tensors are ``weights``: it
        decodes to no more entries than they hold."""
        return cls(codec, tensors, sum(int(np.size(value)) for value in weights.values()))


def split_payload(payload: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Groups]:
    """(plain tensors by name, compressed tensors' parts by tensor name)."""
    plain: dict[str, np.ndarray] = {}
    groups: Groups = {}
    for key, value in payload.items():
        if SEP not in key:
            plain[key] = value
            continue
        name, codec_part = key.split(SEP, 1)
        groups.setdefault(name, {})[codec_part] = value
    return plain, groups


def group_codecs(parts: Mapping[str, np.ndarray]) -> set[str]:
    """The codecs a compressed tensor's parts name (one, when well formed)."""
    return {key.split(SEP, 1)[0] for key in parts}


def group_fields(parts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A compressed tensor's parts by part name, as its codec's `decode` takes them."""
    return {key.split(SEP, 1)[1] if SEP in key else "": value for key, value in parts.items()}


def check_payload(payload: Mapping[str, np.ndarray], form: PayloadForm) -> None:
    """ValueError unless ``payload`` holds what ``form`` allows; decodes nothing."""
    plain, groups = split_payload(payload)
    for name, parts in groups.items():
        _check_codec(name, group_codecs(parts), form.codec)
    if form.tensors is not None:
        _check_names(set(plain) | set(groups), form.tensors)
    for name, value in plain.items():
        _check_shape(name, value.shape, form.tensors, "has")
    decoded = 0
    for name, parts in groups.items():
        shape = codec_class(form.codec)().decoded_shape(name, group_fields(parts))
        if shape is not None:
            _check_shape(name, shape, form.tensors, "claims")
            decoded += math.prod(shape)
    if form.max_decoded is not None and decoded > form.max_decoded:
        raise ValueError(f"compressed tensors claim {decoded} entries in all, more than the "
                         f"model's {form.max_decoded}")


def _check_codec(name: str, codecs: set[str], asked: str) -> None:
    if codecs != {asked}:
        sent = ", ".join(repr(c) for c in sorted(codecs))
        raise ValueError(f"tensor {name!r} comes compressed with {sent}, not asked for (the "
                         f"run's codec for it: {asked!r})")


def _check_names(names: set[str], expected: TensorSpecs) -> None:
    if names != set(expected):
        missing = sorted(set(expected) - names)[:3]
        unexpected = sorted(names - set(expected))[:3]
        raise ValueError(f"tensors do not match the model: missing {missing}, unexpected "
                         f"{unexpected}")


def _check_shape(name: str, shape: tuple[int, ...], expected: TensorSpecs | None,
                 verb: str) -> None:
    """``verb``: "has" (a plain tensor) or "claims" (what a compressed one decodes to)."""
    if expected is None:
        return
    want = tuple(expected[name][0])
    if tuple(shape) != want:
        raise ValueError(f"tensor {name!r} {verb} shape {_shown(shape)}, expected {want}")


def _shown(shape: tuple[int, ...], most: int = 8) -> str:
    """A shape for a one-line message: a hostile one may have a million sizes."""
    if len(shape) <= most:
        return str(tuple(shape))
    return f"({', '.join(map(str, shape[:most]))}, ... {len(shape)} sizes)"
