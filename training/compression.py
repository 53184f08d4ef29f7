"""Compressed updates (node -> coordinator) and weights (coordinator -> node).

Settings come from the run configuration's ``compression`` section:

* ``up``: ``none`` or a codec (training/codecs.py: ``fp16``, ``int8``, ``topk``, or a
  plug-in ``module:Class``) for the updates nodes send back;
* ``down``: ``none`` or a codec usable downwards (``fp16``) for the weights sent with
  every unit;
* ``topk_fraction``: the share of each tensor's entries ``topk`` sends (default 0.01);
* ``topk_warmup_rounds``: rounds over which ``topk`` starts denser (default 0): round r of
  them sends max(topk_fraction, 0.25 ** r) of each tensor, then ``topk_fraction``.

A compressed payload is still a name -> array mapping, so it travels in the IDL's existing
``Tensor`` list: a floating tensor ``w`` becomes parts named ``w#<codec>#<part>``. Anything
else (integer tensors, ``none``, a tensor too small to gain) travels as is, so ``none``
sends exactly today's bytes. `decompress` needs no settings: a payload describes itself,
and the coordinator's update checks run on what it returns.

A codec with ERROR FEEDBACK (``topk``) keeps what a node did not send (the residual) and
adds it to its next update of the same run and unit slot, so over the rounds every part of
the updates is sent: sum of what was sent + the final residual == sum of the raw updates.
The coordinator sends a slot's units back to the node holding its residual
(engine/residual_placement.py).

The sparsity WARM-UP is Deep Gradient Compression's (Lin et al., ICLR 2018: density 25 %,
6.25 %, 1.5625 %, ... over the first epochs): the first updates, computed from the initial
weights, are the largest and least alike, and a residual left from them would be sent
rounds later, against weights that have moved on. Warm-up rounds cost more bytes, so the
run's bytes, not one round's, say what topk saves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from thrift_trainer.training.algorithms.config_checks import ConfigError, section_mapping
from thrift_trainer.training.codecs import SEP, codec_class, known_codecs
from thrift_trainer.training.models.names import BUFFER
from thrift_trainer.training.payload_checks import group_codecs, group_fields, split_payload

Weights = dict[str, np.ndarray]
DEFAULT_TOPK_FRACTION = 0.01
WARMUP_BASE = 0.25  # density of warm-up round r: WARMUP_BASE ** r (DGC's schedule)
SECTION = "compression"  # the run config's section, and its key in a request's config_json
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
        return self.up != "none" and codec_class(self.up).error_feedback

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
    for direction, name in (("up", up), ("down", down)):
        _check_codec(direction, name)
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


def _check_codec(direction: str, name: Any) -> None:
    """ConfigError unless ``name`` is none or a codec usable in ``direction``."""
    if name == "none":
        return
    problem = ""
    try:
        usable = isinstance(name, str) and direction in codec_class(name).directions
    except ValueError as exc:  # PluginError is one: say why the plug-in cannot be used
        usable, problem = False, f" ({exc})" if ":" in str(name) else ""
    if not usable:
        known = ", ".join(["none", *known_codecs(direction)])
        raise ConfigError(f"{SECTION}.{direction}: unknown codec {name!r}; known: {known}"
                          f"{problem}")


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
    """ConfigError unless the algorithm can use the codecs (``supported``: the built-in
    ones it can use, by direction). A plug-in codec suits any update unless it keeps error
    feedback, which suits only the updates ``topk`` suits."""
    for direction in ("up", "down"):
        name = getattr(settings, direction)
        usable = sorted(supported.get(direction, frozenset())) + ["none"]
        if name in usable:
            continue
        codec = codec_class(name)
        if codec.name != name and (not codec.error_feedback or "topk" in usable):
            continue  # a plug-in codec, usable here
        raise ConfigError(f"{SECTION}.{direction}: {algorithm} cannot use {name!r} "
                          f"(it can use: {', '.join(usable)})")


# ------------------------------------------------------------------------- payloads
def _compressible(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and value.dtype != np.float16


def compress(update: Mapping[str, np.ndarray], codec: str, topk_fraction: float = 0.01,
             residual: Mapping[str, np.ndarray] | None = None) -> tuple[Weights, Weights | None]:
    """(payload, new residual) of ``update`` under ``codec``. Only a codec with error
    feedback uses and returns a residual (what it did not send, to add to the next update);
    the others return the residual they were given."""
    if codec == "none":
        return dict(update), residual
    encoder = codec_class(codec)(topk_fraction)
    payload: Weights = {}
    kept: Weights = {}
    for name, value in update.items():
        value = np.asarray(value)
        if not _compressible(value) or (encoder.error_feedback and name.startswith(BUFFER)):
            # a state (a BatchNorm statistic) is not a change: what error feedback leaves
            # out of it would be added rounds later, to another state; it travels whole
            payload[name] = value
            continue
        if encoder.error_feedback:
            previous = (residual or {}).get(name)
            if previous is not None and previous.shape == value.shape:
                value = value + previous.astype(value.dtype)
        parts = encoder.encode(value)
        if parts is None:
            payload[name] = value
        else:
            payload.update({f"{name}{SEP}{codec}{SEP}{part}": data
                            for part, data in parts.items()})
        if encoder.error_feedback:
            rest = value - encoder.decode(name, parts) if parts is not None \
                else np.zeros_like(value)
            if np.all(np.isfinite(rest)):  # a spoiled update must not poison later ones
                kept[name] = rest
    return payload, kept if encoder.error_feedback else residual


def decompress(payload: Mapping[str, np.ndarray]) -> Weights:
    """The update (or weights) a payload encodes; ValueError says what is malformed. What
    came from the network is first checked against what the run asked for
    (training/payload_checks.py), which this does not do."""
    plain, groups = split_payload(payload)
    for name, parts in groups.items():
        if name in plain:
            raise ValueError(f"tensor {name!r} is sent both plain and compressed")
        plain[name] = _decode_group(name, parts)
    return plain


def _decode_group(name: str, parts: dict[str, np.ndarray]) -> np.ndarray:
    codecs = group_codecs(parts)
    if len(codecs) != 1:
        raise ValueError(f"tensor {name!r} mixes codecs {sorted(codecs)}")
    codec = codecs.pop()
    fields = group_fields(parts)
    try:
        decoder = codec_class(codec)()
    except ValueError:
        raise ValueError(f"tensor {name!r}: parts {sorted(fields)} of codec {codec!r} are not "
                         "a known compressed form") from None
    return decoder.decode(name, fields)


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
    """A node's update of round ``round_index`` as it goes on the wire. With a codec that
    keeps error feedback (``topk``, or a plug-in's) the residual of (run, slot) lives in
    the node's session store (compute_node/sessions.py) between units."""
    fraction = settings.fraction_at(round_index)
    if not settings.keeps_residuals or sessions is None:
        return compress(update, settings.up, fraction)[0]
    with sessions.use(run_id, RESIDUAL_SESSION + slot) as session:
        if not isinstance(session.state, Residual):
            session.state = Residual()
        payload, session.state.tensors = compress(update, settings.up, fraction,
                                                  session.state.tensors)
    return payload
