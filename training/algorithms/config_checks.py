"""Reading an algorithm's settings: the error every bad value raises (`ConfigError`, its
message names the key), the type check of a value against its default, and the sections
an algorithm's config shares with the rest of the run (`aggregation`, a torch model's
`model` and `data`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

from thrift_trainer.training import aggregation
from thrift_trainer.training.config_types import checked_value

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value that the algorithm cannot use; the message names the key."""


def section_mapping(section: str, raw: Any, keys: Sequence[str]) -> Mapping[str, Any]:
    """``raw`` as a config section: a mapping of some of ``keys``; ConfigError names the
    section, or the first unknown key as ``section.key``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section} must be a mapping of {', '.join(keys)}, got {raw!r}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(f"unknown key '{section}.{unknown[0]}'; known: {', '.join(keys)}")
    return raw


def checked_section(section: str, raw: Any, defaults: T) -> T:
    """A settings dataclass from the mapping ``raw``: each of its keys checked against the
    type of ``defaults``' value (training/config_types.py), missing ones from
    ``defaults``; ConfigError names the section or the ``section.key`` at fault."""
    keys = [f.name for f in dataclasses.fields(defaults)]  # type: ignore[arg-type]
    raw = section_mapping(section, raw, keys)
    return type(defaults)(**{key: checked_value(f"{section}.{key}",
                                                raw.get(key, getattr(defaults, key)),
                                                getattr(defaults, key), ConfigError)
                             for key in keys})


def check_type(key: str, value: Any, default: Any) -> Any:
    """An algorithm's config key checked against its default's type (training/config_types.py:
    an int is accepted for a float); a list is of hidden sizes, positive integers."""
    label = f"config key {key!r}"
    value = checked_value(label, value, default, ConfigError)
    if isinstance(default, list) and not (value and all(v > 0 for v in value)):
        raise ConfigError(f"{label} must be a list of positive integers, got {value!r}")
    return value


# A torch model's settings in an algorithm's config (training/spec.py): checked by the spec
# and read by training/algorithms/torch_model.py, passed through by `check_config`; and the
# run's federated clients (training/clients/settings.py), read by the algorithms that take
# them (`Algorithm.takes_clients`), and its privacy settings (training/privacy/), read
# by delta_avg.
WORKLOAD_SECTIONS = ("model", "data", "clients", "privacy", "secure_aggregation")


def split_aggregation(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An algorithm's own keys (without its `aggregation` settings and a torch model's
    `model` and `data` sections), and the aggregation settings checked with defaults filled
    in (training/aggregation.py); ConfigError names the bad key."""
    shared = (aggregation.SECTION, *WORKLOAD_SECTIONS)
    rest = {key: value for key, value in config.items() if key not in shared}
    try:
        return rest, aggregation.check_settings(config.get(aggregation.SECTION))
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None


def with_workload(checked: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``checked`` with the `model`, `data`, `clients` and `privacy` sections of
    ``config``, where it has them."""
    return {**checked, **{key: config[key] for key in WORKLOAD_SECTIONS if key in config}}


def checked_settings(config: Mapping[str, Any], known: Mapping[str, Any], owner: str,
                     accepted: Collection[str] | None = None,
                     free: Collection[str] = ()) -> dict[str, Any]:
    """A built-in algorithm's own keys checked against ``known`` (each key it reads, with
    its default): a key outside ``accepted`` (default: ``known``) is refused naming them, a
    key left out or null takes its default, and a value must be of its default's type
    (``free`` keys come as they are, for the algorithm to check)."""
    allowed = list(known) if accepted is None else sorted(accepted)
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r} for {owner}; "
                          f"known: {', '.join(allowed)}")
    checked = {}
    for key, default in known.items():
        value = config.get(key)
        checked[key] = default if value is None else \
            value if key in free else check_type(key, value, default)
    return checked


def checked_fields(schema: type, config: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """``config`` checked against a dataclass's fields: no unknown key, each value of its
    default's type, defaults filled in; ConfigError names the key. The dataclass is then
    built from them, so its own ``__post_init__`` checks run too."""
    if not dataclasses.is_dataclass(schema):
        raise ConfigError(f"{owner}.Config must be a dataclass, got {schema!r}")
    fields = {f.name: f for f in dataclasses.fields(schema)}
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r} for {owner}; known: "
                          f"{', '.join(fields) or 'none'}")
    checked = {}
    for name, spec in fields.items():
        default = _default_of(spec)
        if name not in config:
            if default is dataclasses.MISSING:
                raise ConfigError(f"config key {name!r} of {owner} is required")
            checked[name] = default
        else:
            checked[name] = config[name] if default in (None, dataclasses.MISSING) \
                else check_type(name, config[name], default)
    try:
        schema(**checked)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{owner}: {exc}") from None
    return checked


def _default_of(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def check_round_size(settings: Mapping[str, Any], updates_per_round: int) -> None:
    """ConfigError if the aggregation rule cannot combine rounds of this many updates."""
    try:
        aggregation.check_round_size(settings, updates_per_round)
    except aggregation.AggregationError as exc:
        raise ConfigError(str(exc)) from None
