"""Train requests checked field by field, and against the coordinator's limits, before any
run exists, and the client's own checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_coordinator_handler import train_request
from thrift_trainer.client.cli import parse_train_args
from thrift_trainer.coordinator.cli import build_parser, settings_from
from thrift_trainer.coordinator.handler import CoordinatorHandler
from thrift_trainer.coordinator.records import RunRequest
from thrift_trainer.coordinator.request_checks import (
    RequestLimits,
    check_config,
    check_fields,
    mlp_bytes,
)
from thrift_trainer.coordinator.run import CoordinatorSettings
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.compression import split_config
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.training.run_config import RunConfigError, load_run_config
from thrift_trainer.training.schedule import split_schedule
from thrift_trainer.wire.generated import ttypes

REPO = Path(__file__).resolve().parents[2]


def handler(tmp_path: Path, limits: RequestLimits | None = None) -> CoordinatorHandler:
    nodes_file = tmp_path / "nodes.txt"
    nodes_file.write_text("127.0.0.1,1\n")
    return CoordinatorHandler(nodes_file, CoordinatorSettings(
        data_root=DEFAULT_DATA_ROOT, run_root=tmp_path / "runs", policy=2,
        limits=limits or RequestLimits()))


def config(**keys) -> str:
    return json.dumps(keys)


@pytest.mark.parametrize("changes, message", [
    ({"rounds": 5_000_000}, "rounds: 5000000 is out of range 1..1000000 (this coordinator's "
                            "--max-rounds)"),
    ({"rounds": -1}, "rounds: -1 is out of range"),
    ({"rounds": None}, "rounds: an integer is required, got None"),
    ({"config_json": config(epochs=10**20)}, "config key 'epochs': 100000000000000000000 is "
                                             "out of range 1..1000 (this coordinator's "
                                             "--max-epochs)"),
    ({"config_json": config(hidden=[10**9])}, "config key 'hidden': 1000000000 is out of "
                                              "range 1..8192"),
    ({"config_json": config(hidden=[8000, 8000])}, "--max-model-mb 256"),
    ({"config_json": config(eta=float("inf"))}, "config key 'eta' must be positive"),
    ({"config_json": '{"eta": NaN}'}, "config key 'eta' must be positive"),
    ({"config_json": config(eta=10**400)}, "config key 'eta' is out of range, got an integer "
                                           "of 401 digits"),
    ({"config_json": '{"epochs": ' + "9" * 5000 + "}"}, "config_json is not valid JSON"),
    ({"config_json": config(epochs=10**300)}, "'epochs': an integer of 301 digits is out of "
                                              "range"),
    ({"config_json": config(server_optimizer="momentum", server_lr=-1.0)},
     "config key 'server_lr' must be positive"),
    ({"config_json": config(server_optimizer="momentum", server_momentum=2.0)},
     "config key 'server_momentum' must be in [0, 1)"),
    ({"config_json": config(server_optimizer="sgd")},
     "config key 'server_optimizer': unknown server optimizer 'sgd'"),
    ({"algorithm": "md_gan", "model": "dcgan28-tiny", "dataset": "mnist",
      "config_json": config(swap_every_epochs=1e308)}, "'swap_every_epochs' must be at most"),
    ({"config_json": config(seed=-1)}, "config key 'seed' must be in [0, 2**31)"),
    ({"config_json": config(seed=10**30)}, "config key 'seed' must be in [0, 2**31)"),
    ({"dataset": "d" * 5000}, "dataset: a name of 5000 characters, longer than 255"),
    ({"dataset": ""}, "dataset: a name is required"),
    ({"algorithm": "a" * 5000}, "algorithm: a name of 5000 characters, longer than 64"),
    ({"model": "m" * 5000}, "model: a name of 5000 characters, longer than 64"),
    ({"algorithm": "sync_sgd", "config_json": config(units_per_iteration=10**7)},
     "config key 'units_per_iteration': 10000000 is out of range 1..1000"),
    ({"algorithm": "fl_gan", "model": "dcgan28-tiny", "dataset": "mnist",
      "config_json": config(local_epochs=10**6)}, "config key 'local_epochs': 1000000 is out"),
    ({"algorithm": "md_gan", "model": "dcgan28-tiny", "dataset": "mnist",
      "config_json": config(disc_steps=10**6)}, "config key 'disc_steps': 1000000 is out"),
    ({"outputs_json": json.dumps({"eval_n": 10**30})}, "outputs key 'eval_n' must be at most"),
])
def test_a_bad_field_is_refused_by_name_before_any_run_exists(tmp_path, changes, message):
    coordinator = handler(tmp_path)
    with pytest.raises(ttypes.InvalidRequest) as info:
        coordinator.train(train_request(**changes))
    assert message in info.value.message
    assert "\n" not in info.value.message and len(info.value.message) < 200
    assert coordinator.store.list_runs() == []
    assert not any(p.is_dir() for p in (tmp_path / "runs").iterdir())  # no run folder


def test_limits_are_the_coordinators_and_bound_the_units_a_data_set_makes(tmp_path):
    coordinator = handler(tmp_path, RequestLimits(max_rounds=3, max_epochs=4, max_units=10))

    def refusal(**changes) -> str:
        with pytest.raises(ttypes.InvalidRequest) as info:
            coordinator.train(train_request(**changes))
        return info.value.message

    assert refusal(rounds=4).startswith("rounds: 4 is out of range 1..3")
    assert "'epochs': 5 is out of range 1..4" in refusal(rounds=3, config_json=config(epochs=5))
    # The letters set has 11 unit files: more than 10 units a round.
    assert refusal(rounds=3, config_json=config(epochs=4)) == \
        "units: 11 per round, more than this coordinator's --max-units 10"


def test_the_model_size_limit_holds_for_every_model(tmp_path):
    coordinator = handler(tmp_path, RequestLimits(max_model_mb=0.01))
    with pytest.raises(ttypes.InvalidRequest) as info:
        coordinator.train(train_request(algorithm="fl_gan", model="dcgan28-tiny",
                                        dataset="mnist"))
    assert info.value.message.startswith("model: a model of ")
    assert info.value.message.endswith("MiB, more than this coordinator's --max-model-mb 0.01")


def test_the_model_size_is_counted_without_building_the_model():
    for hidden in ([20], [128, 128], [7, 9, 11]):
        weights = mlp.init_params(mlp.MLPSpec(hidden=tuple(hidden)))
        assert mlp_bytes(hidden) == sum(w.size for w in weights.values()) * 8


@pytest.mark.parametrize("recipe", [None, *sorted((REPO / "configs").glob("*.yaml"))])
def test_every_documented_configuration_is_within_the_default_limits(recipe):
    run = load_run_config(recipe, [])
    limits = RequestLimits()
    check_fields(RunRequest(run_id="r", algorithm=run.algorithm, model=run.model,
                            dataset=run.dataset, rounds=run.rounds, config_json="{}"), limits)
    algorithm = get_algorithm(run.algorithm)
    # as the coordinator does: the compression and schedule sections are not the algorithm's
    config, _ = split_schedule(split_config(run.algorithm_config())[0])
    check_config(algorithm.check_config(run.model, config), limits)


def test_the_readme_examples_are_within_the_default_limits():
    limits = RequestLimits()
    for hidden, epochs in (([20], 15), ([128, 128], 5)):
        check_config({"hidden": hidden, "epochs": epochs}, limits)


def test_the_coordinator_flags_set_the_limits():
    args = build_parser().parse_args(["9095", "2", "--max-rounds", "7", "--max-epochs", "8",
                                      "--max-hidden", "9", "--max-units", "10",
                                      "--max-model-mb", "0.5"])
    assert settings_from(args).limits == RequestLimits(7, 8, 9, 10, 0.5)
    assert settings_from(build_parser().parse_args(["9095", "2"])).limits == RequestLimits()
    for flag, value in (("--max-rounds", "3000000000"), ("--max-epochs", "0"),
                        ("--max-model-mb", "nan")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["9095", "2", flag, value])


def test_the_client_refuses_rounds_a_32_bit_field_cannot_carry(capsys):
    with pytest.raises(SystemExit) as info:
        parse_train_args(["localhost", "9095", "letters", "5000000000", "15", "20", "0.1"])
    assert info.value.code == 2
    assert "rounds" in capsys.readouterr().err
    assert parse_train_args(["h", "1", "letters", "2147483647", "1", "1", "0.1"]).rounds \
        == 2**31 - 1
    with pytest.raises(RunConfigError, match="run.rounds must be at most 2147483647"):
        load_run_config(None, ["run.rounds=5000000000"])
