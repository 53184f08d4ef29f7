"""Configuration of a training run: the schema's defaults <- a recipe <- `--set` overrides.

training/schema.py (and the shared sections' own dataclasses) give every key with its
default, and config.yaml documents them (a unit test keeps the two equal): a key the
schema does not list is a typo, and a value must have the type of its default.
Checking here, on the client, turns a typo into one clear line before anything is sent,
instead of a run that silently trains with a default. Only types are checked; the
algorithm's own `check_config` on the coordinator still owns the value ranges.

The merged configuration becomes a `RunSpec` (training/spec.py), which writes the request.
This module imports no algorithm (and so no torch), which keeps the client light; a unit
test keeps config.yaml equal to the schema.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from thrift_trainer.training import schema
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.compression import CompressionSettings
from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.hierarchy import HierarchySettings
from thrift_trainer.training.models.names import check_model_name, is_module_model
from thrift_trainer.training.models.settings import LOOP_KEYS, ModelSettings
from thrift_trainer.training.plugins import is_plugin_name as _is_plugin
from thrift_trainer.training.schedule import ScheduleSettings
from thrift_trainer.training.spec import RunSpec

# The documented defaults live in the package (config.yaml at the repository root links to
# it), so an installed trainer has them too.
CONFIG_FILE = Path(__file__).resolve().parent / "config.yaml"
RUN = "run"
OUTPUTS = "outputs"
COMPRESSION = "compression"  # sent inside the request's config, checked on the coordinator
AGGREGATION = "aggregation"  # travels inside the algorithm's config (training/aggregation.py)
SCHEDULE = "schedule"  # sent inside the request's config, checked on the coordinator
HIERARCHY = "hierarchy"  # likewise (training/hierarchy.py)
DATA = "data"  # a torch model's data settings, sent as the request config's "data"
CLIENTS = "clients"  # the run's federated clients (training/clients/settings.py)
PRIVACY = "privacy"  # client-level differential privacy (training/privacy/settings.py)
SECURE_AGGREGATION = "secure_aggregation"  # training/secure_aggregation/settings.py
MODEL = "model"  # the request config's key of run.model_args, loss, metric, ... (MODEL_KEYS)
NOT_ALGORITHMS = (RUN, OUTPUTS, COMPRESSION, AGGREGATION, SCHEDULE, HIERARCHY, DATA,
                  CLIENTS, PRIVACY, SECURE_AGGREGATION)
# run keys sent under the request config's "model" key: run.<key> -> model.<name>
MODEL_KEYS = {"model_args": "args", "loss": "loss", "metric": "metric",
              "init_weights": "init_weights", **{key: key for key in LOOP_KEYS}}
# Every section in config.yaml's order, with its schema.
SECTIONS: dict[str, type] = {
    RUN: schema.RunSection, "delta_avg": schema.DeltaAvgSettings,
    "sync_sgd": schema.SyncSgdSettings, "md_gan": schema.MdGanSettings,
    "fl_gan": schema.FlGanSettings, AGGREGATION: schema.AggregationSettings,
    COMPRESSION: CompressionSettings, SCHEDULE: ScheduleSettings,
    HIERARCHY: HierarchySettings, DATA: DataSettings, CLIENTS: ClientsSettings,
    PRIVACY: schema.PrivacySettings,
    SECURE_AGGREGATION: schema.SecureAggregationSettings, OUTPUTS: schema.OutputSettings,
}
# PyYAML follows YAML 1.1, which reads 1e-4 (no dot) as a string; users mean a number.
_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

Sections = dict[str, dict[str, Any]]
DICT_SOURCE = "the configuration dict"  # where a refusal of `sections` says the key was


class RunConfigError(ValueError):
    """A configuration the client refuses; the message names the file or key at fault."""


@dataclass(frozen=True)
class RunConfig:
    """A merged and type-checked run configuration, one dict per section."""

    sections: Mapping[str, Mapping[str, Any]]
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def algorithm(self) -> str:
        return self.sections[RUN]["algorithm"]

    @property
    def model(self) -> str:
        return self.sections[RUN]["model"]

    @property
    def dataset(self) -> str:
        return self.sections[RUN]["dataset"]

    @property
    def rounds(self) -> int:
        return self.sections[RUN]["rounds"]

    @property
    def seed(self) -> int:
        return self.sections[RUN]["seed"]

    @property
    def deterministic(self) -> bool:
        return self.sections[RUN]["deterministic"]

    @property
    def outputs(self) -> dict[str, Any]:
        return self.section(OUTPUTS)

    def to_spec(self) -> RunSpec:
        """The run as a spec (training/spec.py), which writes the request's config_json:
        the chosen algorithm's section (a plug-in algorithm's `run.algorithm_args`), the
        `aggregation` settings, and each other section when it is not its default. The
        spec is built as given: the coordinator owns the value ranges."""
        run = self.sections[RUN]
        own = dict(run["algorithm_args"]) if _is_plugin(self.algorithm) \
            else self.section(self.algorithm)
        model = {name: run[key] for key, name in MODEL_KEYS.items()}
        if not model["lr_rounds"] and ModelSettings(**model).needs_rounds:
            model["lr_rounds"] = run["rounds"]  # a decaying schedule spans the run
        return RunSpec(self.algorithm, self.model, self.dataset, own,
                       aggregation=self.section(AGGREGATION),
                       compression=CompressionSettings(**self.section(COMPRESSION)),
                       schedule=ScheduleSettings(**self.section(SCHEDULE)),
                       hierarchy=HierarchySettings(**self.section(HIERARCHY)),
                       model_settings=ModelSettings(**copy.deepcopy(model)),
                       data=DataSettings(**self.section(DATA)),
                       clients=ClientsSettings(**self.section(CLIENTS)),
                       privacy=schema.PrivacySettings(**self.section(PRIVACY)),
                       secure_aggregation=schema.SecureAggregationSettings(
                           **self.section(SECURE_AGGREGATION)))

    def algorithm_config(self) -> dict[str, Any]:
        """What the train request carries as config_json, as a dict."""
        return self.to_spec().config_dict(with_schedule=True)

    def section(self, name: str) -> dict[str, Any]:
        """A copy of one section, so callers cannot change the configuration under others."""
        return copy.deepcopy(dict(self.sections[name]))

    def to_dict(self) -> Sections:
        """Every section, e.g. to record the exact configuration a run used."""
        return {name: self.section(name) for name in self.sections}


def file_defaults() -> Sections:
    """Every section with its defaults, as config.yaml writes them (null: inherited)."""
    return {name: schema.file_defaults(section) for name, section in SECTIONS.items()}


def load_run_config(path: str | Path | None, overrides: list[str],
                    sections: Mapping[str, Any] | None = None) -> RunConfig:
    """Merge the defaults, the recipe at `path` (if any), `sections` (a recipe given as a
    dict, e.g. from a notebook: ``{"run": {"rounds": 3}}``) and `section.key=value`
    overrides, in that order.

    Raises RunConfigError naming the file, line or key at fault.
    """
    defaults = file_defaults()
    merged = copy.deepcopy(defaults)
    if path is not None:
        _merge_recipe(merged, defaults, _read_sections(Path(path)), str(path))
    if sections is not None:
        if not isinstance(sections, Mapping):
            raise RunConfigError(f"{DICT_SOURCE}: expected sections such as "
                                 f"{{'run': {{...}}}}, got a {type(sections).__name__}")
        _merge_recipe(merged, defaults, dict(sections), DICT_SOURCE)
    for item in overrides:
        _apply_override(merged, defaults, item)
    _inherit_run_values(merged)
    _check_run(merged, defaults)
    return RunConfig(merged, defaults)


# ------------------------------------------------------------------ reading YAML files
class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice, which YAML would let silently win."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _read_sections(path: Path) -> dict[Any, Any]:
    """The top-level mapping of a YAML file; an empty file is an empty recipe."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise RunConfigError(f"cannot read config file {path}: {reason}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise RunConfigError(f"{path}{_yaml_position(exc)}: invalid YAML: "
                             f"{_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RunConfigError(f"{path}: expected sections such as 'run:' at the top level, "
                             f"got a {type(data).__name__}")
    return data


def _yaml_position(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    words = ", ".join(part for part in parts if part)
    return words or str(exc).splitlines()[0]


# ---------------------------------------------------------------------------- merging
def _merge_recipe(merged: Sections, defaults: Sections, recipe: dict[Any, Any],
                  source: str) -> None:
    """Lay a recipe over the merged values, checking every key and type it sets."""
    for name, section in recipe.items():
        name = str(name)
        if name not in defaults:
            raise _unknown(name, defaults, source)
        if not isinstance(section, Mapping):
            raise RunConfigError(f"{name} must be a section of keys (key: value lines), "
                                 f"got {section!r} (in {source})")
        for key, value in section.items():
            _set(merged, defaults, f"{name}.{key}", value, source)


def _apply_override(merged: Sections, defaults: Sections, item: str) -> None:
    """Apply one `section.key=value`; the value is YAML, so 3, 0.1, true, [1, 2] work."""
    source = f"--set {item}"
    dotted, sep, text = item.partition("=")
    dotted = dotted.strip()
    if not sep or not dotted:
        raise RunConfigError(f"{source}: expected section.key=value, e.g. delta_avg.eta=0.01")
    if dotted in defaults:
        example = next(iter(defaults[dotted]), "key")
        raise RunConfigError(f"{source}: '{dotted}' is a section; set one of its keys, "
                             f"e.g. {dotted}.{example}=...")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise RunConfigError(f"{source}: {text!r} is not a valid YAML value") from None
    name, _, rest = dotted.partition(".")
    key, nested, inner = rest.partition(".")
    if nested and isinstance(defaults.get(name, {}).get(key), dict):
        _set_nested(merged[name], name, key, inner, value, source)
    else:
        _set(merged, defaults, dotted, value, source)


def _set_nested(section: dict[str, Any], name: str, key: str, path: str, value: Any,
                source: str) -> None:
    """Set one key inside a mapping-valued key (run.algorithm_args.mu, data.args.n): such a
    mapping is free-form, so its keys and types are checked by whoever reads it."""
    parts = path.split(".")
    if not all(parts):
        raise RunConfigError(f"{source}: an empty key in {name}.{key}.{path}")
    mapping = section[key] = copy.deepcopy(section[key])
    for depth, part in enumerate(parts[:-1]):
        mapping = mapping.setdefault(part, {})
        if not isinstance(mapping, dict):
            where = ".".join([name, key, *parts[:depth + 1]])
            raise RunConfigError(f"{source}: {where} is {mapping!r}, not a mapping of keys")
    mapping[parts[-1]] = value


def _set(merged: Sections, defaults: Sections, dotted: str, value: Any, source: str) -> None:
    name, _, key = dotted.partition(".")
    if name not in defaults or key not in defaults[name]:
        raise _unknown(dotted, defaults, source)
    default = defaults[name][key]
    if default is None:
        default = defaults[RUN].get(key, schema.typed_null(SECTIONS[name], key))
        if value is None:
            merged[name][key] = None
            return
    merged[name][key] = _checked(dotted, value, default, source)


def _unknown(name: str, defaults: Sections, source: str) -> RunConfigError:
    """An unknown key error that suggests what the user probably meant."""
    close = _close_keys(name, defaults)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return RunConfigError(f"unknown key {name!r} (in {source}){hint}")


def _close_keys(name: str, defaults: Sections) -> list[str]:
    """Close spellings in the same section; else keys with that last part; else any close."""
    section, dot, key = name.partition(".")
    if dot and section in defaults:
        return [f"{section}.{m}" for m in difflib.get_close_matches(key, defaults[section])]
    known = [f"{section}.{key}" for section, keys in defaults.items() for key in keys]
    leaf = name.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
    return same_leaf[:3] or difflib.get_close_matches(name, list(defaults) + known)


def _inherit_run_values(merged: Sections) -> None:
    """A null algorithm key takes the run key of the same name (e.g. delta_avg.seed)."""
    for name, section in merged.items():
        for key, value in section.items():
            if value is None and name != RUN and key in merged[RUN]:
                section[key] = merged[RUN][key]


def _check_run(merged: Sections, defaults: Sections) -> None:
    algorithms = [name for name in defaults if name not in NOT_ALGORITHMS]
    run = merged[RUN]
    if run["algorithm"] not in algorithms and not _is_plugin(run["algorithm"]):
        raise RunConfigError(f"run.algorithm must be one of {', '.join(algorithms)} or a "
                             f"plug-in module:Class, got {run['algorithm']!r}")
    if run["algorithm_args"] and not _is_plugin(run["algorithm"]):
        raise RunConfigError(f"run.algorithm_args are a plug-in algorithm's settings; "
                             f"{run['algorithm']}'s are in its section '{run['algorithm']}:'")
    try:
        check_model_name(run["model"])
    except ValueError as exc:
        raise RunConfigError(f"run.model: {exc}") from None
    if not is_module_model(run["model"]):
        torch_keys = [f"run.{key}" for key in MODEL_KEYS if run[key] != defaults[RUN][key]]
        torch_keys += [f"{DATA}.{key}" for key in merged.get(DATA, {})
                       if merged[DATA][key] != defaults.get(DATA, {}).get(key)]
        if torch_keys:
            raise RunConfigError(f"{torch_keys[0]} is for torch models (mlp_classifier or a "
                                 f"plug-in module:attribute), not {run['model']!r}")
    problem = schema.rounds_problem(run["rounds"])
    if problem:
        raise RunConfigError(f"run.rounds: {problem}")


# ---------------------------------------------------------------------------- types
def _checked(dotted: str, value: Any, default: Any, source: str) -> Any:
    """The value, of its default's type (training/config_types.py; an int becomes a float
    where one is expected, and so does a string such as 1e-4, which YAML 1.1 reads as one)."""
    if isinstance(default, float) and isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(
            value.strip()):
        return float(value)
    try:
        return checked_value(dotted, value, default)
    except ValueError as exc:
        raise RunConfigError(f"{exc} (in {source})") from None
