"""Compressed updates (node -> coordinator) and weights (coordinator -> node), as pure codecs.

Settings come from the run configuration's ``compression`` section:

* ``up``: ``none`` | ``fp16`` | ``int8`` | ``topk`` for the updates nodes send back;
* ``down``: ``none`` | ``fp16`` for the weights sent with every unit;
* ``topk_fraction``: the share of each tensor's entries ``topk`` sends (default 0.01);
* ``topk_warmup_rounds``: rounds over which ``topk`` starts denser (default 0): round r of
  them sends max(topk_fraction, 0.25 ** r) of each tensor, then ``topk_fraction``.

A compressed payload is still a name -> array mapping, so it travels in the IDL's existing
``Tensor`` list. A floating tensor ``w`` becomes parts named ``w#<codec>#<part>``:

* ``fp16``: ``w#fp16#<dtype>``, the values as float16, ``<dtype>`` the one to restore;
* ``int8``: ``w#int8#q`` (int8, same shape) and ``w#int8#scale`` (0-d, original dtype):
  ``w = q * scale`` with ``scale = max|w| / 127``, so each entry is off by at most scale/2;
* ``topk``: ``w#topk#values`` (original dtype), ``w#topk#indices`` (flat, int32 or int64)
  and ``w#topk#shape``: the k entries of largest magnitude, every other entry zero.

Anything else (integer tensors, ``none``, a tensor too small to gain) travels as is, so
``none`` sends exactly today's bytes. `decompress` needs no settings: a payload describes
itself, and the coordinator's update checks run on what it returns.

``topk`` keeps ERROR FEEDBACK: what a node did not send (the residual) is added to its next
update of the same run and unit slot, so over the rounds every part of the updates is sent:
sum of what was sent + the final residual == sum of the raw updates. The coordinator sends
a slot's units back to the node holding its residual (engine/residual_placement.py).

The sparsity WARM-UP is Deep Gradient Compression's (Lin et al., ICLR 2018: density 25 %,
6.25 %, 1.5625 %, ... over the first epochs): the first updates, computed from the initial
weights, are the largest and least alike, and a residual left from them would be sent
rounds later, against weights that have moved on. Warm-up rounds cost more bytes, so the
run's bytes, not one round's, say what topk saves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.algorithms.base import ConfigError, section_mapping

Weights = dict[str, np.ndarray]
UP_CODECS = ("none", "fp16", "int8", "topk")
DOWN_CODECS = ("none", "fp16")
DEFAULT_TOPK_FRACTION = 0.01
WARMUP_BASE = 0.25  # density of warm-up round r: WARMUP_BASE ** r (DGC's schedule)
SECTION = "compression"  # the run config's section, and its key in a request's config_json
SEP = "#"
INT8_MAX = 127
# A hostile payload could claim a huge shape for a few bytes: refuse before allocating.
MAX_DECODED_ELEMENTS = 1 << 27
RESIDUAL_SESSION = "residual/"  # node session name prefix of the error feedback residuals
KEYS = ("up", "down", "topk_fraction", "topk_warmup_rounds")


@dataclass(frozen=True)
class CompressionSettings:
    up: str = "none"
    down: str = "none"
    topk_fraction: float = DEFAULT_TOPK_FRACTION
    topk_warmup_rounds: int = 0

    @property
    def active(self) -> bool:
        return self.up != "none" or self.down != "none"

    @property
    def keeps_residuals(self) -> bool:
        """True when nodes keep error feedback residuals (per run) that the run must drop."""
        return self.up == "topk"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fraction_at(self, round_index: int) -> float:
        """The share of each tensor ``topk`` sends in round ``round_index`` (from 1)."""
        if 1 <= round_index <= self.topk_warmup_rounds:
            return max(self.topk_fraction, WARMUP_BASE ** round_index)
        return self.topk_fraction


NONE = CompressionSettings()


def settings_from(raw: Any) -> CompressionSettings:
    """Checked settings from a ``compression`` mapping; ConfigError names the bad key."""
    if raw is None:
        return NONE
    raw = section_mapping(SECTION, raw, KEYS)
    up, down = raw.get("up", "none"), raw.get("down", "none")
    if up not in UP_CODECS:
        raise ConfigError(f"{SECTION}.up: unknown codec {up!r}; known: {', '.join(UP_CODECS)}")
    if down not in DOWN_CODECS:
        raise ConfigError(f"{SECTION}.down: unknown codec {down!r}; known: "
                          f"{', '.join(DOWN_CODECS)}")
    fraction = raw.get("topk_fraction", DEFAULT_TOPK_FRACTION)
    if (isinstance(fraction, bool) or not isinstance(fraction, int | float)
            or not 0 < fraction <= 1):
        raise ConfigError(f"{SECTION}.topk_fraction must be a number in (0, 1], "
                          f"got {fraction!r}")
    warmup = raw.get("topk_warmup_rounds", 0)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= 1000:
        raise ConfigError(f"{SECTION}.topk_warmup_rounds must be an integer in 0..1000, "
                          f"got {warmup!r}")
    return CompressionSettings(up, down, float(fraction), warmup)


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], CompressionSettings]:
    """A request's config without its ``compression`` key, and the checked settings."""
    rest = {k: v for k, v in config.items() if k != SECTION}
    return rest, settings_from(config.get(SECTION))


def join_config(config: Mapping[str, Any], settings: CompressionSettings) -> dict[str, Any]:
    """The config a node gets: the algorithm's, plus the settings when any codec is on (so
    a run without compression sends exactly what it did before compression existed)."""
    return {**config, SECTION: settings.to_dict()} if settings.active else dict(config)


def check_supported(settings: CompressionSettings, algorithm: str,
                    supported: Mapping[str, frozenset[str]]) -> None:
    """ConfigError unless the algorithm can use the codecs (``supported``: by direction)."""
    for direction in ("up", "down"):
        codec = getattr(settings, direction)
        usable = sorted(supported.get(direction, frozenset())) + ["none"]
        if codec not in usable:
            raise ConfigError(f"{SECTION}.{direction}: {algorithm} cannot use {codec!r} "
                              f"(it can use: {', '.join(usable)})")


# ------------------------------------------------------------------------- codecs
def _compressible(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and value.dtype != np.float16


def compress(update: Mapping[str, np.ndarray], codec: str, topk_fraction: float = 0.01,
             residual: Mapping[str, np.ndarray] | None = None) -> tuple[Weights, Weights | None]:
    """(payload, new residual) of ``update`` under ``codec``. Only ``topk`` uses and returns
    a residual (what it did not send, to add to the next update); the others return the
    residual they were given."""
    if codec == "none":
        return dict(update), residual
    if codec == "topk":
        return _topk_all(update, topk_fraction, residual or {})
    encode = {"fp16": _fp16, "int8": _int8}.get(codec)
    if encode is None:
        raise ValueError(f"unknown codec {codec!r}")
    payload: Weights = {}
    for name, value in update.items():
        value = np.asarray(value)
        payload.update(encode(name, value) if _compressible(value) else {name: value})
    return payload, residual


def _fp16(name: str, value: np.ndarray) -> Weights:
    return {f"{name}{SEP}fp16{SEP}{value.dtype.name}": value.astype(np.float16)}


def _int8(name: str, value: np.ndarray) -> Weights:
    # max of a tensor holding NaN is NaN, so the decoded tensor is NaN too and refused.
    peak = np.max(np.abs(value)) if value.size else 0.0
    scale = np.asarray(peak / INT8_MAX, dtype=value.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.rint(value / scale) if scale != 0 else np.zeros(value.shape)
    q = np.clip(np.nan_to_num(q), -INT8_MAX, INT8_MAX).astype(np.int8)
    return {f"{name}{SEP}int8{SEP}q": q, f"{name}{SEP}int8{SEP}scale": scale}


def _topk_all(update: Mapping[str, np.ndarray], fraction: float,
              residual: Mapping[str, np.ndarray]) -> tuple[Weights, Weights]:
    payload: Weights = {}
    kept: Weights = {}
    for name, value in update.items():
        value = np.asarray(value)
        if not _compressible(value):
            payload[name] = value
            continue
        previous = residual.get(name)
        if previous is not None and previous.shape == value.shape:
            value = value + previous.astype(value.dtype)
        sent, rest = _topk(name, value, fraction)
        payload.update(sent)
        if np.all(np.isfinite(rest)):  # a spoiled update must not poison later ones
            kept[name] = rest
    return payload, kept


def _topk(name: str, value: np.ndarray, fraction: float) -> tuple[Weights, np.ndarray]:
    """The largest ``fraction`` of entries by magnitude (at least one), and the rest."""
    flat = value.reshape(-1)
    k = max(1, math.ceil(fraction * flat.size))
    if k >= flat.size:  # nothing to leave out: send the tensor whole
        return {name: value}, np.zeros_like(value)
    magnitude = np.abs(flat)
    magnitude[np.isnan(magnitude)] = np.inf  # NaN entries are sent, so the update is refused
    indices = np.sort(np.argpartition(magnitude, flat.size - k)[flat.size - k:])
    rest = flat.copy()
    rest[indices] = 0
    index_type = np.int32 if flat.size < 2**31 else np.int64
    return {f"{name}{SEP}topk{SEP}values": flat[indices].copy(),
            f"{name}{SEP}topk{SEP}indices": indices.astype(index_type),
            f"{name}{SEP}topk{SEP}shape": np.asarray(value.shape, dtype=np.int64)}, \
        rest.reshape(value.shape)


def decompress(payload: Mapping[str, np.ndarray]) -> Weights:
    """The update (or weights) a payload encodes; ValueError says what is malformed."""
    plain: Weights = {}
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, value in payload.items():
        if SEP not in key:
            plain[key] = value
            continue
        name, codec_part = key.split(SEP, 1)
        groups.setdefault(name, {})[codec_part] = value
    for name, parts in groups.items():
        if name in plain:
            raise ValueError(f"tensor {name!r} is sent both plain and compressed")
        plain[name] = _decode_group(name, parts)
    return plain


def _decode_group(name: str, parts: dict[str, np.ndarray]) -> np.ndarray:
    codecs = {key.split(SEP, 1)[0] for key in parts}
    if len(codecs) != 1:
        raise ValueError(f"tensor {name!r} mixes codecs {sorted(codecs)}")
    codec = codecs.pop()
    fields = {key.split(SEP, 1)[1] if SEP in key else "" for key in parts}
    values = {key.split(SEP, 1)[-1]: value for key, value in parts.items()}
    if codec == "fp16" and len(fields) == 1:
        return _decode_fp16(name, *values.items())
    if codec == "int8" and fields == {"q", "scale"}:
        return _decode_int8(name, values["q"], values["scale"])
    if codec == "topk" and fields == {"values", "indices", "shape"}:
        return _decode_topk(name, values["values"], values["indices"], values["shape"])
    raise ValueError(f"tensor {name!r}: parts {sorted(fields)} of codec {codec!r} are not a "
                     "known compressed form")


def _float_dtype(name: str, dtype_name: str) -> np.dtype:
    if dtype_name not in ("float32", "float64"):
        raise ValueError(f"tensor {name!r}: cannot restore compressed values to {dtype_name!r}")
    return np.dtype(dtype_name)


def _decode_fp16(name: str, item: tuple[str, np.ndarray]) -> np.ndarray:
    dtype_name, value = item
    if value.dtype != np.float16:
        raise ValueError(f"tensor {name!r}: fp16 part has dtype {value.dtype}")
    return value.astype(_float_dtype(name, dtype_name))


def _decode_int8(name: str, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    if q.dtype != np.int8 or scale.shape != ():
        raise ValueError(f"tensor {name!r}: int8 needs int8 values and a 0-d scale")
    dtype = _float_dtype(name, scale.dtype.name)
    return q.astype(dtype) * scale


def _decode_topk(name: str, values: np.ndarray, indices: np.ndarray,
                 shape: np.ndarray) -> np.ndarray:
    if shape.dtype != np.int64 or shape.ndim != 1 or np.any(shape < 0):
        raise ValueError(f"tensor {name!r}: topk shape must be non-negative int64 sizes")
    size = math.prod(int(n) for n in shape)
    if size > MAX_DECODED_ELEMENTS:
        raise ValueError(f"tensor {name!r}: topk shape {shape.tolist()} is too large")
    if indices.dtype.kind != "i" or indices.ndim != 1 or values.shape != indices.shape:
        raise ValueError(f"tensor {name!r}: topk needs as many integer indices as values")
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise ValueError(f"tensor {name!r}: topk index out of range 0..{size - 1}")
    if np.unique(indices).size != indices.size:
        raise ValueError(f"tensor {name!r}: topk indices repeat")
    out = np.zeros(size, dtype=_float_dtype(name, values.dtype.name))
    out[indices] = values
    return out.reshape(tuple(int(n) for n in shape))


# ------------------------------------------------------------- node and coordinator
def encode_weights(weights: Mapping[str, np.ndarray], settings: CompressionSettings) -> Weights:
    """The weights as sent to nodes under ``settings.down`` (unchanged for ``none``)."""
    return compress(weights, settings.down)[0]


class Residual:
    """What a node's topk left unsent for one run and unit slot (a node session's state)."""

    def __init__(self) -> None:
        self.tensors: Weights = {}

    def export(self) -> Weights:
        return dict(self.tensors)


def compress_update(update: Mapping[str, np.ndarray], settings: CompressionSettings,
                    sessions: Any, run_id: str, slot: str, round_index: int = 0) -> Weights:
    """A node's update of round ``round_index`` as it goes on the wire. With ``topk`` the
    residual of (run, slot) lives in the node's session store (compute_node/sessions.py)
    between units."""
    fraction = settings.fraction_at(round_index)
    if settings.up != "topk" or sessions is None:
        return compress(update, settings.up, fraction)[0]
    with sessions.use(run_id, RESIDUAL_SESSION + slot) as session:
        if not isinstance(session.state, Residual):
            session.state = Residual()
        payload, session.state.tensors = compress(update, "topk", fraction,
                                                  session.state.tensors)
    return payload
