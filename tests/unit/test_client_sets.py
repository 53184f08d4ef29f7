"""A data set plug-in that returns several named clients: their data sets one after the
other, each client's own examples and validation part, one clear error for a return value
of another shape, and the nodes' announcements put together (one name, one data)."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.clients import data_parts
from thrift_trainer.training.clients.announced import Announcement, put_together
from thrift_trainer.training.clients.settings import settings_from
from thrift_trainer.training.data.datasets import load_data
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.plugins import PluginError

MODULE = '''
    import torch

    class Rows:
        def __init__(self, start, n, label):
            self.start, self.n, self.label = start, n, label

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if not 0 <= i < self.n:
                raise IndexError(i)
            return torch.tensor([float(self.start + i)]), self.label

    def wards(root, split, extra=0):
        if split == "train":  # given out of name order: the data set keeps name order
            return {"ward-b": Rows(100, 4, 1), "ward-a": Rows(0, 6 + extra, 0),
                    "ward-c": Rows(200, 2, 2)}
        return {"ward-a": Rows(50, 3, 0), "ward-c": Rows(250, 1, 2)}

    def unsplit(size=10):
        return {"one": Rows(0, size, 0), "two": Rows(500, 5, 1)}

    def empty(root, split):
        return {}

    def numbered(root, split):
        return {7: Rows(0, 3, 0)}

    def spaced(root, split):
        return {"ward a": Rows(0, 3, 0)}

    def not_rows(root, split):
        return {"ward-a": [Rows(0, 3, 0)][0], "ward-b": 5}

    def mixed(root, split):
        return {"ward-a": Rows(0, 3, 0)} if split == "train" else Rows(9, 2, 0)

    def stray(root, split):
        return {"ward-a": Rows(0, 3, 0)} if split == "train" else {"ward-z": Rows(9, 2, 0)}
    '''


@pytest.fixture
def sets_module(tmp_path, monkeypatch):
    """The plug-in module in a folder of its own, allowed as --plugins would."""
    (tmp_path / "my_sets.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.setattr(sys, "path", list(sys.path))
    plugins.reset()
    plugins.allow(["my_sets"], tmp_path)
    yield tmp_path
    plugins.reset()
    sys.modules.pop("my_sets", None)


def _load(name: str, root, **values):
    return load_data(name, root, DataSettings.from_mapping(values))


def _values(split, positions) -> list[float]:
    inputs, _ = split.take(np.asarray(positions))
    return inputs[:, 0].tolist()


def test_several_clients_are_their_data_sets_in_name_order_each_a_range(sets_module):
    data = _load("my_sets:wards", sets_module)
    assert list(data.clients) == ["ward-a", "ward-b", "ward-c"]
    assert (len(data.train), len(data.validation)) == (12, 4)
    a, b, c = (data.clients[k] for k in ("ward-a", "ward-b", "ward-c"))
    assert _values(data.train, a.train) == [float(v) for v in range(6)]
    assert _values(data.train, b.train) == [100.0, 101.0, 102.0, 103.0]
    assert _values(data.train, c.train) == [200.0, 201.0]
    assert _values(data.validation, a.validation) == [50.0, 51.0, 52.0]
    assert b.validation.size == 0 and _values(data.validation, c.validation) == [250.0]
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert data.shape.num_classes == 3
    other = _load("my_sets:wards", sets_module, args={"extra": 1})
    assert other.clients["ward-a"].fingerprint != a.fingerprint  # its rows changed
    assert other.fingerprint != data.fingerprint


def test_without_a_split_each_client_holds_out_its_own_share(sets_module):
    data = _load("my_sets:unsplit", sets_module, validation_fraction=0.2)
    one, two = data.clients["one"], data.clients["two"]
    assert (one.train.size, one.validation.size, two.train.size, two.validation.size) == \
        (8, 2, 4, 1)
    kept = _values(data.train, one.train) + _values(data.validation, one.validation)
    assert sorted(kept) == [float(v) for v in range(10)]  # its own examples, none other's
    assert all(v >= 500 for v in _values(data.train, two.train))


@pytest.mark.parametrize("function, words", [
    ("empty", "returned a mapping for split 'train' with no client"),
    ("numbered", "with a client named 7: names are strings"),
    ("spaced", "with a client named 'ward a': names are strings"),
    ("not_rows", "whose client 'ward-b' is not a map-style data set (it needs __len__ and "
                 "__getitem__; it gave a int)"),
    ("mixed", "returned a mapping of clients for one split and a single data set"),
    ("stray", "has validation data of client 'ward-z', which has no training data"),
])
def test_a_return_value_of_another_shape_is_one_error_naming_the_plug_in(
        sets_module, function, words):
    with pytest.raises(PluginError) as caught:
        _load(f"my_sets:{function}", sets_module)
    message = str(caught.value)
    assert message.startswith(f"data set my_sets:{function} ") and words in message
    assert "\n" not in message


def test_a_named_client_trains_on_its_own_examples_and_is_scored_on_its_own(sets_module):
    from thrift_trainer.training.models.module_training import ModelSetup

    setup = ModelSetup.__new__(ModelSetup)  # only its data is read here
    object.__setattr__(setup, "data", _load("my_sets:wards", sets_module))
    settings = settings_from({"placement": "nodes", "validation_fraction": 0.5})
    own = data_parts.own_examples(settings, 0, "ward-b")(setup)
    # ward-b has no validation data of its own: half its examples are held out for it
    held = data_parts.validation_split("ward-b", settings, 0)(setup)
    assert len(own) == 2 and len(held) == 2
    assert sorted(_values(setup.data.train, own) + held.take(np.arange(2))[0][:, 0]
                  .tolist()) == [100.0, 101.0, 102.0, 103.0]
    # ward-a has its own validation part: it trains on every example
    assert len(data_parts.own_examples(settings, 0, "ward-a")(setup)) == 6
    assert len(data_parts.validation_split("ward-a", settings, 0)(setup)) == 3
    assert len(data_parts.resident_examples("ward-c")(setup)) == 2
    with pytest.raises(ConfigError, match="holds no client 'ward-q'"):
        data_parts.own_examples(settings, 0, "ward-q")(setup)


def test_one_name_on_two_nodes_is_one_client_only_with_the_same_data() -> None:
    first = Announcement("n1", {"a": 5, "b": 3}, {"a": {0: 5}, "b": None},
                         {"a": "fa", "b": "fb"})
    replica = Announcement("n2", {"b": 3}, {"b": {1: 3}}, {"b": "fb"})
    other = Announcement("n3", {"c": 2, "a": 5}, {}, {"c": "fc", "a": "fz"})
    resized = Announcement("n4", {"b": 4}, {}, {"b": "fb"})
    clients = put_together([first, replica, other, resized])
    assert clients.sizes == {"a": 5, "b": 3}  # n3's clients are none of the run's
    assert clients.labels == {"a": {0: 5}, "b": {1: 3}}  # a replica shows its counts
    assert [(c.client, c.first, c.other) for c in clients.conflicts] == \
        [("a", "n1", "n3"), ("b", "n1", "n4")]
    assert "data fingerprints fa and fz" in str(clients.conflicts[0])
    assert "3 and 4 examples" in str(clients.conflicts[1])
    assert str(clients.conflicts[0]).startswith("client 'a' is announced by nodes n1 and n3 "
                                                "with different data")
