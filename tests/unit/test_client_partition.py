"""Partitioners: each deals a data set's examples to clients as sorted, disjoint index
arrays, the same for the same seed, with the skew its parameter asks for; plug-ins and
registered names go through the same checked call; impossible settings say so in a line."""

from __future__ import annotations

import numpy as np
import pytest

from thrift_trainer.training.clients import ClientsError, partitioners
from thrift_trainer.training.clients.partition import classes, dirichlet, iid, quantity, shards
from thrift_trainer.training.clients.partitioners import partition
from thrift_trainer.training.plugins import PluginError, allow

BALANCED = np.repeat(np.arange(10), 100)  # 10 labels, 100 examples each, sorted
SKEWED = np.random.default_rng(7).integers(0, 5, size=503)  # 5 labels, unsorted
EVERY_RULE = [("iid", {}), ("dirichlet", {"alpha": 0.5}), ("shards", {}),
              ("classes", {"classes_per_client": 2}), ("quantity", {"size_skew": 1.5}),
              ("quantity", {"size_skew": 1.5, "law": "power"})]


def label_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """The mean over clients of the entropy (bits) of each client's labels."""
    entropies = []
    for part in parts:
        p = np.bincount(labels[part]) / part.size
        p = p[p > 0]
        entropies.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(entropies))


@pytest.mark.parametrize(("name", "params"), EVERY_RULE)
@pytest.mark.parametrize("labels", [BALANCED, SKEWED], ids=["balanced", "skewed"])
def test_every_rule_deals_sorted_disjoint_parts_covering_the_data(name, params,
                                                                  labels) -> None:
    parts = partition(name, labels, 8, seed=3, **params)
    assert len(parts) == 8
    for part in parts:
        assert part.dtype == np.int64 and part.size > 0
        assert np.all(np.diff(part) > 0)  # sorted, and no index twice
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(labels.size))


@pytest.mark.parametrize(("name", "params"), EVERY_RULE)
def test_the_same_seed_deals_the_same_parts_and_another_seed_others(name, params) -> None:
    first = partition(name, SKEWED, 6, seed=11, **params)
    again = partition(name, SKEWED, 6, seed=11, **params)
    other = partition(name, SKEWED, 6, seed=12, **params)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_iid_sizes_differ_by_at_most_one_and_each_client_sees_every_label() -> None:
    parts = iid(BALANCED, 7, seed=0)
    sizes = [part.size for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.unique(BALANCED[part]).size == 10 for part in parts)


def test_dirichlet_label_skew_grows_as_alpha_shrinks() -> None:
    entropies = [label_entropy(dirichlet(BALANCED, 10, seed=1, alpha=alpha, min_size=5),
                               BALANCED) for alpha in (0.1, 1.0, 100.0)]
    assert entropies[0] < entropies[1] < entropies[2]
    assert entropies[2] > 3.2  # near log2(10) = 3.32: almost IID


def test_dirichlet_redraws_until_every_client_has_min_size_or_refuses() -> None:
    parts = dirichlet(BALANCED, 10, seed=0, alpha=0.05, min_size=20)
    assert min(part.size for part in parts) >= 20
    with pytest.raises(ClientsError, match="1 draws left some of 50 clients under 20 "
                                           "examples; raise alpha"):
        dirichlet(BALANCED, 50, seed=0, alpha=0.01, min_size=20, max_draws=1)


def test_shards_give_each_client_at_most_shards_per_client_labels() -> None:
    for count in (10, 25, 50):
        parts = shards(BALANCED, count, seed=count, shards_per_client=2)
        seen = [np.unique(BALANCED[part]).size for part in parts]
        assert max(seen) <= 2 and sum(seen) > count  # most clients see two labels
        assert {part.size for part in parts} == {BALANCED.size // count}


def test_classes_give_each_client_its_labels_and_hold_every_label() -> None:
    parts = classes(BALANCED, 10, seed=2, classes_per_client=3)
    held = [set(np.unique(BALANCED[part]).tolist()) for part in parts]
    assert all(len(labels) == 3 for labels in held)
    assert set().union(*held) == set(range(10))
    assert len({frozenset(labels) for labels in held}) > 2  # not one block repeated


def test_classes_drop_the_labels_no_client_holds() -> None:
    parts = classes(BALANCED, 3, seed=0, classes_per_client=2)  # 6 of 10 labels held
    joined = np.concatenate(parts)
    assert joined.size == 600 and np.unique(BALANCED[joined]).size == 6


def test_quantity_skew_spreads_sizes_and_keeps_labels_iid() -> None:
    labels = np.repeat(np.arange(10), 1000)
    equal = quantity(labels, 20, seed=0, size_skew=0.0)
    assert {part.size for part in equal} == {500}
    for law in ("lognormal", "power"):
        mild = [p.size for p in quantity(labels, 20, seed=0, size_skew=0.5, law=law)]
        steep = [p.size for p in quantity(labels, 20, seed=0, size_skew=2.0, law=law)]
        assert np.std(mild) < np.std(steep)
    big = max(quantity(labels, 20, seed=0, size_skew=1.0), key=len)
    assert np.bincount(labels[big]).min() > 0.5 * big.size / 10


def test_quantity_gives_every_client_its_min_size_even_when_steep() -> None:
    parts = quantity(BALANCED, 30, seed=4, size_skew=50.0, law="power", min_size=3)
    assert min(part.size for part in parts) >= 3
    assert sum(part.size for part in parts) == BALANCED.size


@pytest.mark.parametrize(("call", "words"), [
    (lambda: iid(BALANCED[:5], 6, 0), "6 clients for 5 examples"),
    (lambda: iid(BALANCED, 0, 0), "client count must be an integer >= 1"),
    (lambda: iid(np.zeros((2, 3), int), 1, 0), "labels must be a 1-D array of integers"),
    (lambda: iid(np.linspace(0, 1, 9), 2, 0), "labels must be a 1-D array of integers"),
    (lambda: dirichlet(BALANCED, 4, 0, alpha=0.0), "alpha must be a finite number > 0"),
    (lambda: dirichlet(BALANCED, 4, 0, alpha=float("nan")), "alpha must be a finite"),
    (lambda: dirichlet(BALANCED, 200, 0), "200 clients of at least 10 examples need 2000"),
    (lambda: shards(BALANCED, 600, 0), "1200 shards \\(600 clients x 2\\) need 1200"),
    (lambda: shards(BALANCED, 4, 0, shards_per_client=0), "shards_per_client must be"),
    (lambda: classes(BALANCED, 4, 0, classes_per_client=11),
     "classes_per_client 11 is above the 10 labels"),
    (lambda: classes(np.array([0, 0, 0, 0, 0, 1]), 4, 0, classes_per_client=2),
     "label 1 has 1 examples for 4 clients"),
    (lambda: quantity(BALANCED, 4, 0, size_skew=-1.0), "size_skew must be a finite number"),
    (lambda: quantity(BALANCED, 4, 0, law="zipf"), "law must be one of lognormal, power"),
])
def test_impossible_settings_raise_one_line(call, words) -> None:
    with pytest.raises(ClientsError, match=words) as refused:
        call()
    assert isinstance(refused.value, ValueError) and "\n" not in str(refused.value)


# ------------------------------------------------------------------- registry, plug-ins
MY_PARTITIONERS = """
import numpy as np


def halves(labels, count, seed, reverse=False):
    parts = np.array_split(np.arange(len(labels)), count)
    return parts[::-1] if reverse else parts


def overlapping(labels, count, seed):
    return [np.arange(len(labels))] * count


class NotAFunction:
    pass
"""


@pytest.fixture
def own_partitioners(plugin_module, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitioners, "PARTITIONERS", dict(partitioners.PARTITIONERS))
    allow(["my_parts"], plugin_module("my_parts", MY_PARTITIONERS))


def test_a_plugin_partitioner_is_called_with_its_parameters(own_partitioners) -> None:
    parts = partition("my_parts:halves", np.arange(6), 2, seed=0, reverse=True)
    assert [part.tolist() for part in parts] == [[3, 4, 5], [0, 1, 2]]


def test_a_registered_partitioner_is_usable_by_its_plain_name(own_partitioners) -> None:
    partitioners.register_partitioner("halves",
                                      partitioners.partitioner_of("my_parts:halves"))
    assert [p.tolist() for p in partition("halves", np.arange(4), 2, 0)] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="must be plain"):
        partitioners.register_partitioner("a:b", iid)


@pytest.mark.parametrize(("name", "params", "error", "words"), [
    ("my_parts:overlapping", {}, ClientsError, "gave an example to more than one client"),
    ("my_parts:halves", {"colour": 1}, ClientsError,
     "partitioner my_parts:halves: got an unexpected keyword argument 'colour'"),
    ("iid", {"alpha": 1.0}, ClientsError, "partitioner iid: got an unexpected keyword"),
    ("my_parts:NotAFunction", {}, PluginError, "NotAFunction is a class, not a function"),
    ("other_parts:halves", {}, PluginError,
     "it allows my_parts; start it with --plugins my_parts,other_parts"),
    ("fair", {}, ClientsError, "unknown partitioner 'fair': one of iid, dirichlet, shards"),
])
def test_a_partitioner_that_cannot_be_used_is_refused_naming_it(own_partitioners, name,
                                                                 params, error, words) -> None:
    with pytest.raises(error, match=words):
        partition(name, np.arange(6), 2, 0, **params)


def test_parts_out_of_range_or_too_few_are_refused() -> None:
    with pytest.raises(ClientsError, match="indices outside 0..4"):
        partitioners.checked_parts([np.array([0, 5])], 5, 1)
    with pytest.raises(ClientsError, match="gave 1 parts for 2 clients"):
        partitioners.checked_parts([np.array([0])], 5, 2)
