"""The run spec: a request's config parsed once into typed sections, and back."""

from __future__ import annotations

import json

import pytest

from thrift_trainer.training.compression import CompressionSettings
from thrift_trainer.training.spec import RunSpec, SpecError


def _spec(config: dict) -> RunSpec:
    return RunSpec.parse("delta_avg", "mlp", "letters", json.dumps(config))


def test_each_shared_section_is_parsed_into_its_settings_and_the_rest_is_the_algorithms():
    spec = _spec({"eta": 0.01, "aggregation": {"rule": "median"},
                  "compression": {"up": "int8"}, "schedule": {"mode": "async"},
                  "hierarchy": {"relay_local_rounds": 2},
                  "model": {"args": {"hidden": [8]}, "loss": "mse"},
                  "data": {"format": "csv", "label": "species"}})
    assert spec.config == {"eta": 0.01}
    assert spec.aggregation_rule == "median"
    assert spec.compression == CompressionSettings(up="int8")
    assert spec.schedule.mode == "async"
    assert spec.hierarchy.relay_local_rounds == 2
    assert spec.model_settings.args == {"hidden": [8]} and spec.model_settings.loss == "mse"
    assert spec.data.format == "csv" and spec.data.label == "species"


def test_a_built_in_run_sends_its_nodes_exactly_the_config_it_always_did():
    """Sections at their defaults stay out of the request (and so does the schedule,
    which is the coordinator's alone)."""
    config = {"eta": 0.01, "epochs": 2}
    assert json.loads(_spec(config).to_config_json()) == config
    spec = _spec({**config, "schedule": {"mode": "async"}})
    assert json.loads(spec.to_config_json()) == config


def test_torch_model_settings_travel_only_when_they_differ_from_their_defaults():
    spec = _spec({"model": {"args": {}, "loss": "auto"}, "data": {"format": "auto"}})
    assert spec.algorithm_config() == {}
    spec = _spec({"model": {"loss": "mse"}, "data": {"normalize": True}})
    assert spec.algorithm_config() == {"model": {"loss": "mse"}, "data": {"normalize": True}}


def test_parsing_what_a_spec_wrote_gives_the_same_spec():
    spec = _spec({"eta": 0.5, "compression": {"up": "fp16"}, "model": {"metric": "loss"},
                  "data": {"validation_fraction": 0.2}, "expect": {"model": "abc"}})
    again = RunSpec.parse("delta_avg", "mlp", "letters", spec.to_config_json())
    assert again == spec


def test_the_plug_ins_a_run_names_are_listed_for_the_checks_before_round_1():
    spec = RunSpec.parse("my_algos:FedProx", "my_models:Net", "my_data:load", json.dumps(
        {"model": {"loss": "my_models:step"}, "aggregation": {"rule": "my_rules:gm"}}))
    assert sorted(spec.plugin_names) == ["my_algos:FedProx", "my_data:load",
                                         "my_models:Net", "my_models:step", "my_rules:gm"]
    assert _spec({}).plugin_names == []


@pytest.mark.parametrize(("config_json", "message"), [
    ("{", "config_json is not valid JSON"),
    ("[1]", "config_json must hold a JSON object"),
    ('{"compression": {"up": "zip"}}', "compression.up: unknown codec 'zip'"),
    ('{"schedule": {"mode": "sometimes"}}', "schedule.mode"),
    ('{"model": {"size": 3}}', "unknown key 'run.model_size'"),
    ('{"model": {"loss": "hinge"}}', "run.loss must be one of auto, cross_entropy, mse"),
    ('{"data": {"format": "parquet"}}', "data.format must be one of"),
    ('{"data": {"channels": 2}}', "data.channels must be 1 or 3"),
    ('{"data": {"validation_fraction": 1.5}}', "data.validation_fraction must be in"),
    ('{"data": {"image_size": "big"}}', "data.image_size must be an integer"),
    ('{"expect": 3}', "config key 'expect' must be a mapping"),
])
def test_a_bad_config_is_refused_with_the_key_at_fault(config_json: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        RunSpec.parse("delta_avg", "mlp", "letters", config_json)
