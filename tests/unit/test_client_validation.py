"""Each client's validation part (clients.validation_fraction) and the figures of a
federated evaluation: the split is seeded, reproducible and disjoint from the client's
training examples, the partition's fingerprint covers it, and the federated figures are
the size-weighted means of the clients' lines."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from thrift_trainer.coordinator.client_eval import eval_figures
from thrift_trainer.coordinator.client_files import per_client
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients import data_parts
from thrift_trainer.training.clients.fingerprint import PartitionRecord, fingerprint
from thrift_trainer.training.clients.settings import settings_from

LABELS = np.arange(600) % 6


def _setup(labels: np.ndarray = LABELS, validation: int = 0) -> SimpleNamespace:
    """What data_parts reads of a ModelSetup: the training part's labels and size."""
    data = SimpleNamespace(fingerprint=f"fake-{labels.size}", train=_Split(labels),
                           validation=_Split(np.zeros(validation, dtype=np.int64)))
    return SimpleNamespace(data=data)


class _Split:
    def __init__(self, labels: np.ndarray) -> None:
        self.targets = labels

    def __len__(self) -> int:
        return int(self.targets.size)

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return indices, self.targets[indices]


def _settings(**values: object) -> object:
    return settings_from({"count": 10, "partition": "dirichlet", **values})


def test_the_split_is_reproducible_disjoint_and_holds_out_the_fraction() -> None:
    part = np.arange(5, 205, 2)
    train, held = data_parts.split_validation(part, 0.25, seed=7, index=3)
    again = data_parts.split_validation(part.copy(), 0.25, seed=7, index=3)
    assert np.array_equal(train, again[0]) and np.array_equal(held, again[1])
    assert held.size == 25 and train.size == 75
    assert not set(train) & set(held) and set(train) | set(held) == set(part)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(held) > 0)
    other = data_parts.split_validation(part, 0.25, seed=7, index=4)[1]
    assert not np.array_equal(held, other)  # each client draws its own
    assert data_parts.split_validation(np.arange(1), 0.5, 0, 0)[0].size == 1  # keeps one


def test_every_process_deals_the_same_parts_disjoint_from_the_training_ones() -> None:
    settings = _settings(validation_fraction=0.2)
    train, record = data_parts.parts_of(_setup(), settings, seed=3)
    held = data_parts.validation_parts_of(_setup(), settings, seed=3)
    fresh = data_parts._split_all(  # another process computes the same
        data_parts.parts_of(_setup(), _settings(), seed=3)[0], LABELS, settings, 3)
    assert all(np.array_equal(a, b) for a, b in zip(train, fresh[0], strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(held, fresh[1], strict=True))
    everything = np.concatenate(train + held)
    assert np.array_equal(np.sort(everything), np.arange(LABELS.size))  # disjoint, all dealt
    assert record.sizes == [len(p) for p in train]
    assert record.validation_sizes == [len(p) for p in held] and sum(record.validation_sizes)
    assert record.fingerprint == fingerprint(train + held)


def test_the_fingerprint_changes_with_the_fraction_and_stays_without_one() -> None:
    plain = data_parts.parts_of(_setup(), _settings(), seed=3)
    assert plain[1].fingerprint == fingerprint(plain[0])  # as before validation parts
    assert "validation_sizes" not in plain[1].to_dict()
    prints = {data_parts.parts_of(_setup(), _settings(validation_fraction=f), seed=3)[1]
              .fingerprint for f in (0.0, 0.1, 0.2)}
    assert len(prints) == 3
    record = data_parts.parts_of(_setup(), _settings(validation_fraction=0.1), seed=3)[1]
    assert PartitionRecord.from_json(record.to_json()) == record


def test_a_node_resident_client_uses_its_own_validation_part_when_it_has_one() -> None:
    settings = settings_from({"placement": "nodes", "validation_fraction": 0.1})
    with_split = _setup(validation=40)
    assert len(data_parts.own_examples(settings, 0)(with_split)) == LABELS.size
    assert data_parts.validation_split("site", settings, 0)(with_split) \
        is with_split.data.validation
    without = _setup()
    own = data_parts.own_examples(settings, 0)(without)
    scored = data_parts.validation_split("site", settings, 0)(without)
    assert len(own) == 540 and len(scored) == 60
    assert not set(own) & set(scored.indices)


@pytest.mark.parametrize("values, words", [
    ({"eval_every": 2}, "needs clients.validation_fraction > 0"),
    ({"validation_fraction": 0.95}, "validation_fraction must be in"),
    ({"validation_fraction": -0.1}, "validation_fraction must be in"),
    ({"eval_every": -1, "validation_fraction": 0.1}, "eval_every must be 0"),
    ({"eval_per_round": 2.5, "validation_fraction": 0.1}, "eval_per_round must be"),
])
def test_settings_that_cannot_evaluate_are_refused_in_one_line(values, words) -> None:
    with pytest.raises(ConfigError, match=words):
        _settings(**values)


def test_evaluation_settings_travel_only_when_set_and_pick_their_rounds() -> None:
    assert "eval_every" not in _settings().to_dict()
    settings = _settings(validation_fraction=0.1, eval_every=3, eval_per_round=4)
    assert settings_from(settings.to_dict()) == settings
    assert [r for r in range(1, 11) if settings.evaluates(r, 10)] == [3, 6, 9, 10]
    names = settings.names()
    chosen = settings.evaluated(3, 0, names)
    assert len(chosen) == 4 and chosen == settings.evaluated(3, 0, list(reversed(names)))
    with pytest.raises(ConfigError, match="for runs with clients"):
        settings_from({"validation_fraction": 0.1})


def test_the_federated_figures_are_the_size_weighted_means_of_the_lines() -> None:
    rows = [{"round": 2, "client": "client0", "kind": "eval", "examples": 10,
             "val_loss": 1.0, "val_error": 0.5, "val_accuracy": 0.5, "node": "n:1"},
            {"round": 2, "client": "client1", "kind": "eval", "examples": 30,
             "val_loss": 2.0, "val_error": 0.1, "val_accuracy": 0.9, "node": "n:2"},
            {"round": 2, "client": "client2", "kind": "eval", "dropped": "no live node"}]
    figures = eval_figures(rows)
    assert figures["clients_evaluated"] == 2 and figures["clients_eval_missed"] == 1
    assert figures["federated_val_loss"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert figures["federated_val_accuracy"] == pytest.approx((10 * 0.5 + 30 * 0.9) / 40)
    assert figures["client_val_accuracy_mean"] == pytest.approx(0.7)
    assert figures["client_val_accuracy_worst10"] == pytest.approx(0.5)
    assert figures["client_val_accuracy_std"] == pytest.approx(0.2)
    table = {entry["client"]: entry for entry in per_client(rows + [
        {"round": 2, "client": "client0", "examples": 50, "loss_before": 2.5,
         "train_loss": 2.0, "node": "n:1"}])}
    assert table["client0"]["trained"] == 1 and table["client0"]["evaluated"] == 1
    assert table["client0"]["loss_before"] == 2.5 and table["client0"]["val_accuracy"] == 0.5
    assert table["client2"]["trained"] == 0 and table["client2"]["dropped"] == 0


def test_the_summary_shows_the_latest_federated_evaluation_under_the_clients_line() -> None:
    from thrift_trainer.client.display import client_lines

    training = {"round": 4, "clients_trained": 3, "client_loss_mean": 1.5,
                "client_loss_worst10": 2.0, "client_loss_std": 0.25}
    assert len(client_lines(training)) == 1  # no evaluation yet: the clients' line only
    lines = client_lines({**training, "eval_round": 4, "clients_evaluated": 2,
                          "clients_eval_missed": 1, "federated_val_loss": 0.8,
                          "federated_val_accuracy": 0.75, "client_val_accuracy_mean": 0.7,
                          "client_val_accuracy_worst10": 0.5,
                          "client_val_accuracy_std": 0.2})
    assert lines[1] == ("Federated evaluation (round 4): 2 clients (1 missed), validation "
                        "accuracy 0.7500 (weighted by examples), loss 0.8000; per client "
                        "mean 0.7000, worst 10% 0.5000, spread (std) 0.2000")
