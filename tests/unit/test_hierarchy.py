"""Relays' local rounds: the hierarchy settings, and the shares a relay's members compute."""

from __future__ import annotations

import pytest

from thrift_trainer.compute_node import cli
from thrift_trainer.compute_node.handler import run_unit, share_of
from thrift_trainer.compute_node.relay import local_rounds, member_shares
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.hierarchy import (
    FLAT,
    check_usable,
    join_hierarchy,
    settings_from,
    split_hierarchy,
)
from thrift_trainer.training.units import UnitJob, UnitSpec
from thrift_trainer.wire.generated import ttypes

LETTERS = DEFAULT_DATA_ROOT / "letters"


@pytest.mark.parametrize("raw, message", [
    ({"relay_local_rounds": 0}, "hierarchy.relay_local_rounds must be an integer in 1..100"),
    ({"relay_local_rounds": 2.5}, "hierarchy.relay_local_rounds"),
    ({"relay_local_rounds": True}, "hierarchy.relay_local_rounds"),
    ({"local_rounds": 2}, "unknown key 'hierarchy.local_rounds'"),
    ([2], "hierarchy must be a mapping"),
])
def test_bad_hierarchy_settings_are_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError, match=message):
        settings_from(raw)


def test_local_rounds_are_for_algorithms_whose_update_is_a_model_delta():
    three = settings_from({"relay_local_rounds": 3})
    check_usable(three, get_algorithm("delta_avg"))
    for algorithm in ("sync_sgd", "fl_gan", "md_gan"):
        with pytest.raises(ConfigError, match=f"relay_local_rounds: {algorithm} cannot"):
            check_usable(three, get_algorithm(algorithm))
    check_usable(FLAT, get_algorithm("sync_sgd"))  # one round: every algorithm, as always


def test_the_section_travels_only_when_it_asks_for_local_rounds():
    config = {"eta": 0.01}
    assert join_hierarchy(config, FLAT) == config  # requests stay what they were
    joined = join_hierarchy(config, settings_from({"relay_local_rounds": 3}))
    rest, settings = split_hierarchy(joined)
    assert rest == config and settings.relay_local_rounds == 3
    assert local_rounds(_job('{"eta": 0.01, "hierarchy": {"relay_local_rounds": 3}}')) == 3
    assert local_rounds(_job('{"eta": 0.01}')) == 1


def _job(config_json: str) -> UnitJob:
    return UnitJob("r", 1, UnitSpec("u", "train_letters1.txt"), "mlp", {}, {},
                   algorithm="delta_avg", dataset="letters", config_json=config_json)


def test_a_relay_gives_each_member_one_share_of_the_unit():
    unit = UnitSpec("u3", "train_03.txt")
    shares = member_shares(unit, 3)
    assert [(u.unit_id, u.unit_path, s) for u, s in shares.items()] == [
        ("u3~r0", "train_03.txt", (0, 3)), ("u3~r1", "train_03.txt", (1, 3)),
        ("u3~r2", "train_03.txt", (2, 3))]
    assert list(member_shares(unit, 1).values()) == [None]  # a group of one: the whole unit


def request(part, parts) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(part=part, parts=parts)


def test_a_request_names_a_share_or_the_whole_unit():
    assert share_of(request(None, None)) is None
    assert share_of(request(1, 3)) == (1, 3)
    for part, parts in ((3, 3), (-1, 2), (0, 1), (None, 2), (0, None)):
        with pytest.raises(ValueError, match="a share needs part"):
            share_of(request(part, parts))


def test_a_node_computes_only_its_share_of_a_letters_unit():
    algorithm = DeltaAveraging("mlp", {"epochs": 1, "hidden": [8]}, LETTERS)
    unit = algorithm.plan_round(1)[0]
    rows = len(load_letters(LETTERS / unit.unit_path)[1])
    job = UnitJob("r", 1, unit, "mlp", algorithm.config, algorithm.initial_weights())
    halves = [run_unit(DeltaAveraging, UnitJob(**{**vars(job), "share": (k, 2)}), LETTERS)
              for k in range(2)]
    assert [h.num_samples for h in halves] == [rows - rows // 2, rows // 2]
    assert run_unit(DeltaAveraging, job, LETTERS).num_samples == rows
    assert all(set(h.update) == set(job.weights) for h in halves)


def test_a_members_port_without_a_relay_is_refused(capsys):
    assert cli.main(["0", "0", "--members-port", "0"]) == 2
    assert "--members-port is for a relay's members" in capsys.readouterr().err
