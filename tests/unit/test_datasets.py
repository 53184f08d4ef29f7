"""Data sets of torch models: the built-in formats read real files, plug-ins are called as
documented, and the fingerprint tells copies apart."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from thrift_trainer.training import plugins
from thrift_trainer.training.data.datasets import DataError, held_out, load_data
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.data.tables import TableError
from thrift_trainer.training.plugins import PluginError

LETTERS = DEFAULT_DATA_ROOT / "letters"


def _settings(**values) -> DataSettings:
    return DataSettings.from_mapping(values)


def test_letters_as_a_table_are_the_shards_in_order_and_the_validation_file():
    data = load_data("letters", LETTERS, _settings(format="letters"))
    first, _ = load_letters(LETTERS / "train_letters1.txt")
    held, held_labels = load_letters(LETTERS / "validate_letters.txt")
    assert len(data.train) == 11 * 1500 and len(data.validation) == len(held_labels)
    inputs, targets = data.train.take(np.arange(3))
    assert torch.equal(inputs, torch.from_numpy(first[:3].astype(np.float32)))
    assert data.shape.input_shape == (16,) and data.shape.num_classes == 26
    assert targets.dtype == torch.int64


def test_mnist_with_labels_is_the_split_of_the_shipped_images():
    data = load_data("mnist", DEFAULT_DATA_ROOT / "mnist", _settings())
    assert (len(data.train), len(data.validation)) == (8000, 2000)
    inputs, targets = data.validation.take(np.arange(4))
    assert inputs.shape == (4, 1, 28, 28) and float(inputs.min()) >= -1.0
    assert data.shape.num_classes == 10 and set(targets.tolist()) <= set(range(10))


def test_a_csv_with_a_header_and_word_labels_numbers_its_classes_in_sorted_order(tmp_path):
    (tmp_path / "train.csv").write_text("a,b,kind\n1,2,cat\n3,4,dog\n5,6,cat\n")
    (tmp_path / "held.csv").write_text("a,b,kind\n7,8,dog\n")
    data = load_data("t", tmp_path, _settings(format="csv", label="kind",
                                              validation="held.csv"))
    inputs, targets = data.train.take(np.arange(3))
    assert inputs.tolist() == [[1, 2], [3, 4], [5, 6]] and targets.tolist() == [0, 1, 0]
    assert data.validation.take(np.arange(1))[1].tolist() == [1]
    assert data.shape.num_classes == 2


def test_a_tsv_with_real_targets_is_regression_and_normalized_by_the_training_part(tmp_path):
    rows = "\n".join(f"{i}\t{2 * i}\t{0.5 * i}" for i in range(20))
    (tmp_path / "all.tsv").write_text(rows + "\n")
    data = load_data("t", tmp_path, _settings(format="tsv", header="no", normalize=True,
                                              validation_fraction=0.25))
    assert (len(data.train), len(data.validation)) == (15, 5)
    inputs, targets = data.train.take(np.arange(15))
    assert targets.dtype == torch.float32 and data.shape.num_classes is None
    assert torch.allclose(inputs.mean(dim=0), torch.zeros(2), atol=1e-5)


@pytest.mark.parametrize(("content", "message"), [
    ("a,b\n1,2\n3\n", "line 3: 1 columns, the table has 2"),
    ("a,b\nx,1\n", "is not a number"),
])
def test_a_malformed_table_is_refused_naming_the_file(tmp_path, content, message):
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises((DataError, TableError), match=message):
        load_data("t", tmp_path, _settings(format="csv", label="b"))


def test_class_folders_of_images_are_read_grey_and_resized(tmp_path):
    for split, count in (("train", 3), ("validation", 1)):
        for cls, shade in (("ants", 0), ("bees", 255)):
            folder = tmp_path / split / cls
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (40, 30), (shade, shade, shade)).save(folder / f"{i}.png")
    data = load_data("imgs", tmp_path, _settings(format="images", image_size=16))
    inputs, targets = data.train.take(np.arange(6))
    assert inputs.shape == (6, 1, 16, 16) and targets.tolist() == [0, 0, 0, 1, 1, 1]
    assert float(inputs[0].max()) == -1.0 and float(inputs[-1].min()) == 1.0
    assert len(data.validation) == 2 and data.shape.num_classes == 2


def test_arrays_from_an_npz_and_the_held_out_choice_is_the_same_everywhere(tmp_path):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    np.savez(tmp_path / "train.npz", x=x, y=np.arange(20) % 3)
    data = load_data("arr", tmp_path, _settings(format="arrays", validation_fraction=0.2))
    train, held = held_out(20, 0.2)
    assert np.array_equal(data.train.take(np.arange(16))[0].numpy(), x[train])
    assert np.array_equal(data.validation.take(np.arange(4))[0].numpy(), x[held])
    assert np.array_equal(held_out(20, 0.2)[1], held)


def test_the_fingerprint_follows_the_files_bytes(tmp_path):
    (tmp_path / "a.csv").write_text("1,0\n2,1\n3,0\n4,1\n")
    settings = _settings(format="csv", header="no", validation_fraction=0.25)
    first = load_data("t", tmp_path, settings).fingerprint
    (tmp_path / "a.csv").write_text("1,0\n2,1\n3,0\n5,1\n")
    assert load_data("t", tmp_path, settings).fingerprint != first


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A data set plug-in module in a folder of its own, allowed as --plugins would."""
    (tmp_path / "my_data.py").write_text(textwrap.dedent('''
        import torch

        class Squares:
            num_classes = 2

            def __init__(self, n):
                self.n = n

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                return torch.tensor([float(i)]), i % 2

        def make(root, split, size=10):
            return Squares(size if split == "train" else 4)

        def one(size=10):
            return Squares(size)

        def not_a_data_set():
            return 3
        '''))
    monkeypatch.setattr(sys, "path", list(sys.path))
    plugins.reset()
    plugins.allow(["my_data"], tmp_path)
    yield tmp_path
    plugins.reset()
    sys.modules.pop("my_data", None)


def test_a_plug_in_data_set_gets_its_root_split_and_arguments(plugin_module):
    data = load_data("my_data:make", plugin_module, _settings(args={"size": 6}))
    assert (len(data.train), len(data.validation)) == (6, 4)
    inputs, targets = data.train.take(np.array([2, 3]))
    assert inputs.tolist() == [[2.0], [3.0]] and targets.tolist() == [0, 1]
    assert data.shape.num_classes == 2 and data.shape.input_shape == (1,)


def test_a_plug_in_without_a_split_is_split_by_the_validation_fraction(plugin_module):
    data = load_data("my_data:one", plugin_module, _settings(validation_fraction=0.3))
    assert (len(data.train), len(data.validation)) == (7, 3)


def test_a_plug_in_that_is_not_a_map_style_data_set_is_refused_by_name(plugin_module):
    with pytest.raises(PluginError, match="my_data:not_a_data_set is not a map-style"):
        load_data("my_data:not_a_data_set", plugin_module, _settings())


def test_a_data_set_module_not_allowed_names_the_flag(tmp_path):
    plugins.reset()
    with pytest.raises(PluginError, match="lacks plug-in other: it allows no plug-in module; "
                                          "start it with --plugins other"):
        load_data("other:make", tmp_path, _settings())
