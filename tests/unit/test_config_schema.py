"""The run config's schema (training/schema.py) is the one home of its defaults, and
config.yaml documents exactly what it holds."""

from __future__ import annotations

import yaml

from thrift_trainer.training import schema
from thrift_trainer.training.run_config import CONFIG_FILE, SECTIONS, file_defaults


def _typed(value: object) -> object:
    """A value with the types of its parts, so 1 and 1.0 or [1] and [1.0] differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_config_yaml_lists_every_key_of_the_schema_in_order_with_its_default():
    documented = yaml.safe_load(CONFIG_FILE.read_text())
    assert list(documented) == list(SECTIONS)
    for name, section in file_defaults().items():
        assert list(documented[name]) == list(section), name
        assert _typed(documented[name]) == _typed(section), name


def test_a_null_in_config_yaml_is_a_default_taken_from_elsewhere():
    assert schema.file_defaults(schema.DeltaAvgSettings)["seed"] is None
    assert schema.defaults(schema.DeltaAvgSettings)["seed"] == 1
    assert schema.file_defaults(schema.MdGanSettings)["k"] is None
    assert schema.defaults(schema.MdGanSettings)["k"] == "log2"


def test_sync_sgd_keys_depend_on_the_kind_of_model():
    common = ["images_per_work_unit", "num_workunits_per_update", "units_per_iteration",
              "batch_size", "seed"]
    gan = schema.sync_sgd_defaults(schema.GAN)
    mlp = schema.sync_sgd_defaults(schema.MLP)
    module = schema.sync_sgd_defaults(schema.MODULE)
    assert list(gan) == [*common, "lr_g", "lr_d", "beta1", "beta2", "batchnorm"]
    assert list(mlp) == [*common, "lr", "hidden", "scale_features"]
    assert list(module) == [*common, "lr", "optimizer", "weight_decay"]
    assert (mlp["lr"], module["lr"]) == (0.01, 0.001)


def test_defaults_are_copies_a_caller_cannot_change_for_others():
    schema.defaults(schema.AggregationSettings)["rule"] = "median"
    schema.file_defaults(schema.DeltaAvgSettings)["hidden"].append(5)
    assert schema.defaults(schema.AggregationSettings)["rule"] == "mean"
    assert schema.file_defaults(schema.DeltaAvgSettings)["hidden"] == [20]
