"""A run's specification, parsed and checked once: what to train, on what, and how.

A train request (and every unit sent to a node) names the algorithm, the model and the
data set, and carries the rest in ``config_json``: a JSON object holding the algorithm's
own keys, plus one key per shared section when it is not the default:

* ``aggregation``: how a round's updates are combined (training/aggregation.py),
* ``compression``: how updates and weights travel (training/compression.py),
* ``schedule``: sync, async or buffered (training/schedule.py),
* ``hierarchy``: how relays train their groups (training/hierarchy.py),
* ``clients``: the run's federated clients (training/clients/settings.py),
* ``privacy``: client-level differential privacy (training/privacy/settings.py),
* ``model``: a torch model's arguments, loss, metric and starting weights
  (training/models/settings.py),
* ``data``: how a torch model's data set is read (training/data/settings.py);
* ``expect``: what the coordinator built of a torch model and its data set (fingerprints,
  training/run_check.py), which every unit carries so that a node checks itself.

`RunSpec.parse` turns that into typed settings, in one place, for the coordinator, the
nodes, relays and local workers alike; the client builds one from its run configuration
(training/run_config.py); `RunSpec.to_config_json` is its inverse and the one writer of
``config_json``, for train requests and units alike, and a run
that leaves a section at its default sends exactly the request it sent before the section
existed. The algorithm's own keys are checked by the algorithm (`Algorithm.check_config`,
which for a plug-in may use a dataclass it declares); the spec itself imports no torch, so
the client can parse and check a run before sending it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thrift_trainer.training import compression, hierarchy, plugins, schedule
from thrift_trainer.training.aggregation import SECTION as AGGREGATION
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients import settings as clients
from thrift_trainer.training.clients.settings import ClientsSettings
from thrift_trainer.training.compression import CompressionSettings
from thrift_trainer.training.data.settings import SECTION as DATA
from thrift_trainer.training.data.settings import DataSettings, DataSettingsError
from thrift_trainer.training.hierarchy import HierarchySettings
from thrift_trainer.training.models.settings import SECTION as MODEL
from thrift_trainer.training.models.settings import ModelSettings, ModelSettingsError
from thrift_trainer.training.privacy import settings as privacy
from thrift_trainer.training.schedule import ScheduleSettings
from thrift_trainer.training.schema import PrivacySettings, SecureAggregationSettings
from thrift_trainer.training.secure_aggregation import settings as secure_aggregation

EXPECT = "expect"
SHARED_SECTIONS = (AGGREGATION, compression.SECTION, schedule.SECTION, hierarchy.SECTION,
                   MODEL, DATA, EXPECT, clients.SECTION, privacy.SECTION,
                   secure_aggregation.SECTION)


class SpecError(ConfigError):
    """A request that cannot be a run; the message names the field or key at fault."""


@dataclass(frozen=True)
class RunSpec:
    algorithm: str
    model: str
    dataset: str
    config: dict[str, Any]  # the algorithm's own keys, as the request holds them
    aggregation: dict[str, Any] | None = None  # checked by the algorithm (split_aggregation)
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    hierarchy: HierarchySettings = field(default_factory=HierarchySettings)
    model_settings: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    expect: dict[str, Any] = field(default_factory=dict)
    clients: ClientsSettings = clients.NONE
    privacy: PrivacySettings = privacy.OFF
    secure_aggregation: SecureAggregationSettings = secure_aggregation.OFF

    @classmethod
    def parse(cls, algorithm: str, model: str, dataset: str,
              config_json: str | None) -> RunSpec:
        """The spec of a request's fields; SpecError names what is wrong."""
        config = _json_object(config_json)
        expect = config.get(EXPECT) or {}
        if not isinstance(expect, dict):
            raise SpecError(f"config key {EXPECT!r} must be a mapping, got {expect!r}")
        try:
            return cls(
                algorithm=algorithm, model=model, dataset=dataset,
                config={k: v for k, v in config.items() if k not in SHARED_SECTIONS},
                aggregation=config.get(AGGREGATION),
                compression=compression.settings_from(config.get(compression.SECTION)),
                schedule=schedule.settings_from(config.get(schedule.SECTION)),
                hierarchy=hierarchy.settings_from(config.get(hierarchy.SECTION)),
                model_settings=ModelSettings.from_mapping(config.get(MODEL)),
                data=DataSettings.from_mapping(config.get(DATA)), expect=expect,
                clients=clients.settings_from(config.get(clients.SECTION)),
                privacy=privacy.settings_from(config.get(privacy.SECTION)),
                secure_aggregation=secure_aggregation.settings_from(
                    config.get(secure_aggregation.SECTION)))
        except (ConfigError, DataSettingsError, ModelSettingsError) as exc:
            raise SpecError(str(exc)) from None

    @property
    def plugin_names(self) -> list[str]:
        """The plug-ins the run names (``module:attribute``), for the checks before round 1."""
        return [name for _, name in self.named_plugins]

    @property
    def named_plugins(self) -> list[tuple[str, str]]:
        """(kind, name) of each plug-in the run names, the kind as `plugins.resolve` takes
        it: what the name must be."""
        named = [("algorithm", self.algorithm), ("model", self.model),
                 ("data set", self.dataset), ("loss", self.model_settings.loss),
                 ("metric", self.model_settings.metric), ("transform", self.data.transform),
                 ("codec", self.compression.up),
                 ("codec", self.compression.down)]
        rule = (self.aggregation or {}).get("rule") if isinstance(self.aggregation,
                                                                   Mapping) else None
        named.append(("aggregation rule", rule if isinstance(rule, str) else ""))
        return [(kind, name) for kind, name in named if plugins.is_plugin_name(name)]

    @property
    def aggregation_rule(self) -> str:
        rule = self.aggregation.get("rule") if isinstance(self.aggregation, Mapping) else None
        return rule if isinstance(rule, str) else "mean"

    def algorithm_config(self) -> dict[str, Any]:
        """What the algorithm is built with: its own keys, the aggregation settings, and the
        model and data settings of a torch model when they are not the defaults."""
        config = dict(self.config)
        if self.aggregation is not None:
            config[AGGREGATION] = self.aggregation
        if self.model_settings.changed():
            config[MODEL] = self.model_settings.changed()
        if self.data.changed():
            config[DATA] = self.data.changed()
        config = privacy.join_privacy(clients.join_clients(config, self.clients), self.privacy)
        return secure_aggregation.join_secure_aggregation(config, self.secure_aggregation)

    def config_dict(self, checked_config: Mapping[str, Any] | None = None, *,
                    with_schedule: bool = False) -> dict[str, Any]:
        """The config as a request carries it: ``checked_config`` (the algorithm's config
        with its defaults filled in) or the config as parsed, with the compression and
        hierarchy sections when they are not the defaults. The schedule is the
        coordinator's alone (nodes compute a unit the same way in every mode), so only a
        train request (``with_schedule``) carries it, and only when it is not plain sync."""
        config = dict(checked_config) if checked_config is not None else \
            self.algorithm_config()
        config = compression.join_config(config, self.compression)
        if with_schedule:
            config = schedule.join_schedule(config, self.schedule)
        config = hierarchy.join_hierarchy(config, self.hierarchy)
        if self.expect:
            config[EXPECT] = self.expect
        return config

    def to_config_json(self, checked_config: Mapping[str, Any] | None = None, *,
                       with_schedule: bool = False) -> str:
        """The one writer of ``config_json``: `config_dict` as JSON, what a train request
        (``with_schedule``) or every unit sent to the nodes carries."""
        return json.dumps(self.config_dict(checked_config, with_schedule=with_schedule))


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError as exc:  # JSONDecodeError, and numbers too long to convert
        raise SpecError(f"config_json is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise SpecError("config_json must hold a JSON object")
    return value
