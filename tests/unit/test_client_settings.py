"""The `clients` section: its checks, how it travels in a request, and which runs may
have it; the nodes' --clients lists."""

from __future__ import annotations

import json

import pytest

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients.held import HeldClients
from thrift_trainer.training.clients.settings import (
    NONE,
    ClientsSettings,
    client_index,
    join_clients,
    settings_from,
)
from thrift_trainer.training.run_config import load_run_config
from thrift_trainer.training.spec import RunSpec


def test_a_run_without_clients_sends_the_request_it_always_sent():
    spec = load_run_config(None, ["run.model=mlp_classifier"]).to_spec()
    assert "clients" not in spec.to_config_json()
    assert join_clients({"a": 1}, NONE) == {"a": 1}


def test_the_section_travels_and_parses_back():
    config = load_run_config(None, ["run.model=mlp_classifier", "clients.count=20",
                                    "clients.partition=shards", "clients.per_round=0.25",
                                    "clients.over_select=1.5"])
    spec = config.to_spec()
    parsed = RunSpec.parse(spec.algorithm, spec.model, spec.dataset, spec.to_config_json())
    assert parsed.clients == ClientsSettings(count=20, partition="shards", per_round=0.25,
                                             over_select=1.5)
    assert parsed.algorithm_config()["clients"]["count"] == 20


@pytest.mark.parametrize("raw, word", [
    ({"count": -1}, "clients.count"), ({"count": 2, "per_round": 2.5}, "per_round"),
    ({"count": 2, "per_round": -0.1}, "per_round"), ({"count": 2, "over_select": 0.5},
                                                     "over_select"),
    ({"count": 2, "partition": "nope"}, "clients.partition"), ({"cout": 2}, "clients.cout"),
    ({"count": "many"}, "clients.count"),
])
def test_bad_settings_are_refused_naming_the_key(raw, word):
    with pytest.raises(ConfigError, match=word.replace(".", r"\.")):
        settings_from(raw)


@pytest.mark.parametrize("per_round, count, target", [(0.0, 10, 10), (3.0, 10, 3),
                                                      (0.25, 10, 2), (30.0, 10, 10)])
def test_per_round_is_every_client_a_count_or_a_fraction(per_round, count, target):
    settings = ClientsSettings(count=count, per_round=per_round)
    assert settings.target(count) == target
    assert len(settings.sampled(1, 7, settings.names())) == target


def test_over_selection_asks_more_and_the_same_round_samples_the_same_clients():
    settings = ClientsSettings(count=100, per_round=10.0, over_select=1.3)
    asked = settings.sampled(4, 1, settings.names())
    assert len(asked) == 13 and settings.target(100) == 10
    assert asked == settings.sampled(4, 1, settings.names())  # a resumed run asks these
    assert asked != settings.sampled(5, 1, settings.names())


def test_client_names_are_checked():
    assert client_index("client7", 8) == 7
    for bad in ("client8", "client07", "client", "x7", "client-1"):
        with pytest.raises(ConfigError):
            client_index(bad, 8)


def test_held_clients_parse_and_name_the_run_clients():
    held = HeldClients.parse("0-2, 5,9-20")
    assert 1 in held and 5 in held and 4 not in held
    assert held.names(11) == ["client0", "client1", "client2", "client5", "client9",
                              "client10"]
    assert str(held) == "0-2,5,9-20"
    for bad in ("", "3-1", "a", "1-", "-1", "0-2000000"):
        with pytest.raises(ValueError):
            HeldClients.parse(bad)


# ------------------------------------------------------------ which runs take clients
def _prepare(overrides: list[str]):
    from pathlib import Path

    from thrift_trainer.coordinator.records import RunRequest
    from thrift_trainer.coordinator.request_checks import RequestLimits
    from thrift_trainer.coordinator.run_setup import prepare

    config = load_run_config(None, overrides)
    spec = config.to_spec()
    request = RunRequest("r1", spec.algorithm, spec.model, spec.dataset, 2,
                         json.dumps(config.algorithm_config()))
    return prepare(request, Path(__file__).resolve().parents[2] / "data", RequestLimits(),
                   deterministic=False)


@pytest.mark.parametrize("overrides, why", [
    (["clients.count=4"], "the letters MLP's units are its train_\\* files"),
    (["run.algorithm=md_gan", "run.model=dcgan28-tiny", "run.dataset=mnist",
      "clients.count=3"], "clients.count \\(3\\) must equal md_gan.workers \\(4\\)"),
    (["run.model=mlp_classifier", "data.format=letters", "schedule.mode=buffered",
      "clients.count=4", "clients.over_select=1.5"], "over_select has no meaning in "
     "'buffered' mode"),
    (["run.model=mlp_classifier", "data.format=letters", "schedule.mode=async",
      "clients.placement=nodes"], "placement nodes in 'async' mode needs "
     "schedule.updates_per_round"),
    (["run.algorithm=sync_sgd", "run.model=mlp_classifier", "data.format=letters",
      "schedule.mode=buffered", "clients.count=4"], "sync_sgd trains clients in sync rounds "
     "only \\('buffered' mode draws clients under delta_avg\\)"),
    (["run.algorithm=sync_sgd", "run.model=mlp_classifier", "data.format=letters",
      "clients.count=4", "clients.validation_fraction=0.2", "clients.eval_every=2"],
     "eval_every: sync_sgd does not score clients' validation parts"),
])
def test_a_run_that_cannot_have_clients_is_refused_in_one_line(overrides, why):
    from thrift_trainer.coordinator.run_setup import InvalidRun

    with pytest.raises(InvalidRun, match=f"^clients: .*{why}") as info:
        _prepare(overrides)
    assert "\n" not in str(info.value)


def test_federated_evaluation_is_taken_in_the_asynchronous_modes():
    setup = _prepare(["run.model=mlp_classifier", "data.format=letters", "clients.count=4",
                      "schedule.mode=buffered", "clients.validation_fraction=0.2",
                      "clients.eval_every=2"])
    assert [u.unit_id for u in setup.algorithm.evaluation_units(2, 2)] == \
        [f"eval-client{k}" for k in range(4)]
    assert setup.algorithm.evaluation_units(1, 2) == []


def test_a_torch_model_on_clients_may_train_them_in_a_stream():
    setup = _prepare(["run.model=mlp_classifier", "data.format=letters", "clients.count=10",
                      "schedule.mode=async", "clients.per_round=4"])
    algorithm = setup.algorithm
    assert [unit.client for unit in algorithm.client_units()] == [f"client{k}"
                                                                  for k in range(10)]
    assert algorithm.clients_at_once(8) == 4  # per_round: FedBuff's concurrency


def test_a_torch_model_on_clients_plans_a_sample_of_them_weighed_by_size():
    setup = _prepare(["run.model=mlp_classifier", "data.format=letters", "clients.count=10",
                      "clients.partition=quantity", "clients.per_round=3",
                      "clients.over_select=1.4"])
    algorithm = setup.algorithm
    units = algorithm.plan_round(1)
    assert len(units) == 5 and algorithm.quorum(len(units)) == 3  # ceil(3 x 1.4) asked
    assert all(unit.client == unit.unit_id for unit in units)
    record = algorithm.partition
    assert sum(record.sizes) == len(algorithm._plan.state.setup.data.train)  # all dealt
    for unit in units:
        assert algorithm.unit_samples(unit) == record.sizes[int(unit.client[6:])]
    assert len(set(record.sizes)) > 1  # quantity skew: unequal sizes
