"""Codecs: how one floating-point tensor is encoded for the wire, and decoded back.

A codec turns a tensor ``w`` into named parts that travel in the IDL's ``Tensor`` list as
``w#<codec>#<part>`` (training/compression.py applies codecs to whole updates and keeps
error feedback). Built in:

* ``fp16``: one part named after the dtype to restore, the values as float16;
* ``int8``: ``q`` (int8, same shape) and ``scale`` (0-d, original dtype): ``w = q * scale``
  with ``scale = max|w| / 127``, so each entry is off by at most scale/2;
* ``topk``: ``values`` (original dtype), ``indices`` (flat, int32 or int64) and ``shape``:
  the k entries of largest magnitude, every other entry zero; with error feedback.

A new codec is a `Codec` subclass: registered by name (`register_codec`, e.g. by an
installed plug-in package) or named as a plug-in (``compression.up: my_codecs:SignSGD``).
Its `decode` must refuse malformed parts with ValueError: they come from the network.
Its `decoded_shape`, when it can tell the shape without decoding, lets a receiver refuse a
tensor of the wrong shape, or larger than its model, before any memory goes to it
(training/payload_checks.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from thrift_trainer.training import plugins

Parts = dict[str, np.ndarray]
SEP = "#"
INT8_MAX = 127
# A hostile payload could claim a huge shape for a few bytes: refuse before allocating.
MAX_DECODED_ELEMENTS = 1 << 27


class Codec:
    """One way to send a floating-point tensor. Subclasses set `name` and implement
    `encode` and `decode`."""

    name: ClassVar[str] = ""
    # Where the codec may be used: "up" (updates nodes send), "down" (weights sent to nodes).
    directions: ClassVar[frozenset[str]] = frozenset({"up"})
    # True: what a tensor's encoding leaves out is kept on the node and added to its next
    # update of the same unit slot (error feedback), so over the rounds all of it is sent.
    # Such a codec suits only updates that add up over rounds (deltas, gradients).
    error_feedback: ClassVar[bool] = False

    def __init__(self, fraction: float = 1.0) -> None:
        """``fraction``: the share of entries a sparsifying codec sends this round."""
        self.fraction = fraction

    def encode(self, value: np.ndarray) -> Parts | None:
        """The parts of ``value`` (float32 or float64), by part name; None to send it as
        it is."""
        raise NotImplementedError

    def decode(self, name: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        """The tensor ``name`` from its parts; ValueError when they are malformed."""
        raise NotImplementedError

    def decoded_shape(self, name: str, parts: Mapping[str, np.ndarray]) -> tuple[int, ...] | None:
        """The shape `decode` would return, found without decoding (ValueError when the parts
        cannot say one); None when the codec cannot tell before decoding."""
        return None


class Fp16(Codec):
    name = "fp16"
    directions = frozenset({"up", "down"})

    def encode(self, value: np.ndarray) -> Parts:
        return {value.dtype.name: value.astype(np.float16)}

    def decode(self, name: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        dtype_name, value = self._part(name, parts)
        return value.astype(float_dtype(name, dtype_name))

    def decoded_shape(self, name: str, parts: Mapping[str, np.ndarray]) -> tuple[int, ...]:
        return self._part(name, parts)[1].shape

    @staticmethod
    def _part(name: str, parts: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray]:
        """(the dtype to restore, the float16 values)."""
        if len(parts) != 1:
            raise ValueError(f"tensor {name!r}: fp16 needs one part, got {sorted(parts)}")
        ((dtype_name, value),) = parts.items()
        if value.dtype != np.float16:
            raise ValueError(f"tensor {name!r}: fp16 part has dtype {value.dtype}")
        return dtype_name, value


class Int8(Codec):
    name = "int8"

    def encode(self, value: np.ndarray) -> Parts:
        # max of a tensor holding NaN is NaN, so the decoded tensor is NaN too and refused.
        peak = np.max(np.abs(value)) if value.size else 0.0
        scale = np.asarray(peak / INT8_MAX, dtype=value.dtype)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.rint(value / scale) if scale != 0 else np.zeros(value.shape)
        q = np.clip(np.nan_to_num(q), -INT8_MAX, INT8_MAX).astype(np.int8)
        return {"q": q, "scale": scale}

    def decode(self, name: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        _expect(name, self.name, parts, {"q", "scale"})
        q, scale = parts["q"], parts["scale"]
        if q.dtype != np.int8 or scale.shape != ():
            raise ValueError(f"tensor {name!r}: int8 needs int8 values and a 0-d scale")
        return q.astype(float_dtype(name, scale.dtype.name)) * scale

    def decoded_shape(self, name: str, parts: Mapping[str, np.ndarray]) -> tuple[int, ...]:
        _expect(name, self.name, parts, {"q", "scale"})
        return parts["q"].shape


class TopK(Codec):
    name = "topk"
    error_feedback = True

    def encode(self, value: np.ndarray) -> Parts | None:
        """The largest ``fraction`` of entries by magnitude (at least one)."""
        flat = value.reshape(-1)
        k = max(1, math.ceil(self.fraction * flat.size))
        if k >= flat.size:  # nothing to leave out: send the tensor whole
            return None
        magnitude = np.abs(flat)
        magnitude[np.isnan(magnitude)] = np.inf  # NaN entries are sent, so it is refused
        indices = np.sort(np.argpartition(magnitude, flat.size - k)[flat.size - k:])
        index_type = np.int32 if flat.size < 2**31 else np.int64
        return {"values": flat[indices].copy(), "indices": indices.astype(index_type),
                "shape": np.asarray(value.shape, dtype=np.int64)}

    def decoded_shape(self, name: str, parts: Mapping[str, np.ndarray]) -> tuple[int, ...]:
        _expect(name, self.name, parts, {"values", "indices", "shape"})
        shape = parts["shape"]
        if shape.dtype != np.int64 or shape.ndim != 1 or np.any(shape < 0):
            raise ValueError(f"tensor {name!r}: topk shape must be non-negative int64 sizes")
        return tuple(int(n) for n in shape)

    def decode(self, name: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        shape = self.decoded_shape(name, parts)
        values, indices = parts["values"], parts["indices"]
        size = math.prod(shape)
        if size > MAX_DECODED_ELEMENTS:
            raise ValueError(f"tensor {name!r}: topk shape {list(shape)} is too large")
        if indices.dtype.kind != "i" or indices.ndim != 1 or values.shape != indices.shape:
            raise ValueError(f"tensor {name!r}: topk needs as many integer indices as values")
        if indices.size and (indices.min() < 0 or indices.max() >= size):
            raise ValueError(f"tensor {name!r}: topk index out of range 0..{size - 1}")
        if np.unique(indices).size != indices.size:
            raise ValueError(f"tensor {name!r}: topk indices repeat")
        out = np.zeros(size, dtype=float_dtype(name, values.dtype.name))
        out[indices] = values
        return out.reshape(shape)


_REGISTRY: dict[str, type[Codec]] = {c.name: c for c in (Fp16, Int8, TopK)}


def register_codec(codec: type[Codec]) -> type[Codec]:
    """Make ``codec`` usable under its `name` (usable as a class decorator)."""
    if not (isinstance(codec, type) and issubclass(codec, Codec)) or not codec.name:
        raise TypeError(f"{codec!r} is not a Codec subclass with a name")
    if SEP in codec.name:
        raise ValueError(f"a codec's name cannot hold {SEP!r}: {codec.name!r}")
    _REGISTRY[codec.name] = codec
    return codec


def codec_class(name: str) -> type[Codec]:
    """The codec of a registered name or a plug-in ``module:Class``; ValueError if none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if plugins.is_plugin_name(name):
        found = plugins.resolve(name, "codec")
        if not (isinstance(found, type) and issubclass(found, Codec)):
            raise plugins.PluginError(f"codec {name} is not a subclass of "
                                      "thrift_trainer.Codec")
        return found
    raise ValueError(f"unknown codec {name!r}; known: {', '.join(sorted(_REGISTRY))}, or a "
                     "plug-in module:Class")


def known_codecs(direction: str) -> list[str]:
    return sorted(name for name, codec in _REGISTRY.items() if direction in codec.directions)


def float_dtype(name: str, dtype_name: str) -> np.dtype:
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"tensor {name!r}: cannot restore compressed values to {dtype_name!r}")
    return np.dtype(dtype_name)


def _expect(name: str, codec: str, parts: Mapping[str, np.ndarray], fields: set[str]) -> None:
    if set(parts) != fields:
        raise ValueError(f"tensor {name!r}: parts {sorted(parts)} of codec {codec!r} are not "
                         "a known compressed form")
