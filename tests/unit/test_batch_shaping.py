"""Training batches as a node shapes them: augmentation, a transform plug-in, given
normalisation statistics and reading ahead (training/data/batches.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thrift_trainer.training import plugins
from thrift_trainer.training.data import preprocessing
from thrift_trainer.training.data.batches import Reader, random_crop, random_flip
from thrift_trainer.training.data.datasets import DataError, load_data
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.data.settings import DataSettings, DataSettingsError
from thrift_trainer.training.models import objectives
from thrift_trainer.training.models.module_training import LocalSteps, ModelSetup, train_locally
from thrift_trainer.training.models.settings import DataShape, ModelSettings
from thrift_trainer.training.plugins import PluginError
from thrift_trainer.training.units import unit_seed

torch.set_num_threads(1)
IMAGES = DataShape((1, 6, 6), 3)
MNIST = DEFAULT_DATA_ROOT / "mnist"


def _images(n: int = 8) -> torch.Tensor:
    return torch.arange(n * 36, dtype=torch.float32).reshape(n, 1, 6, 6)


def _take(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return _images(16)[torch.from_numpy(indices)], torch.from_numpy(indices % 3)


def _read(settings: DataSettings, seed: int) -> list[torch.Tensor]:
    order = [np.arange(k, k + 4) for k in range(0, 16, 4)]
    return [inputs for _, inputs, _ in Reader(settings, IMAGES).batches(_take, order, seed)]


def test_a_flip_mirrors_some_images_and_keeps_the_others():
    images = _images()
    flipped = random_flip(images, torch.Generator().manual_seed(0))
    mirrored = [bool(torch.equal(f, i.flip(-1))) for f, i in zip(flipped, images, strict=True)]
    kept = [bool(torch.equal(f, i)) for f, i in zip(flipped, images, strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert any(mirrored) and any(kept)


def test_a_crop_is_a_window_of_the_padded_image():
    images = _images(4)
    cropped = random_crop(images, 2, torch.Generator().manual_seed(1))
    assert cropped.shape == images.shape
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for image, crop in zip(padded, cropped, strict=True):
        assert any(torch.equal(image[:, y:y + 6, x:x + 6], crop)
                   for y in range(5) for x in range(5))


def test_augmentation_is_reproducible_per_seed_and_differs_between_seeds():
    settings = DataSettings(augment="crop_flip", crop_padding=2)
    first, again, other = _read(settings, 11), _read(settings, 11), _read(settings, 12)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(first, other, strict=True))
    plain = _read(DataSettings(), 11)
    assert all(torch.equal(p, _take(np.arange(k, k + 4))[0])
               for p, k in zip(plain, range(0, 16, 4), strict=True))


def test_reading_ahead_gives_the_same_batches_in_order():
    settings = DataSettings(augment="crop_flip")
    ahead = _read(DataSettings(augment="crop_flip", prefetch=2), 5)
    assert all(torch.equal(a, b) for a, b in zip(ahead, _read(settings, 5), strict=True))


def test_an_error_while_reading_ahead_is_raised_to_the_reader():
    def broken(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if indices[0] >= 8:
            raise OSError("disk gone")
        return _take(indices)
    reader = Reader(DataSettings(prefetch=3), IMAGES)
    batches = reader.batches(broken, [np.arange(k, k + 4) for k in range(0, 16, 4)], 0)
    assert next(batches)[0].tolist() == [0, 1, 2, 3]
    with pytest.raises(OSError, match="disk gone"):
        list(batches)


def test_augmenting_examples_that_are_not_images_is_refused_naming_the_shape():
    with pytest.raises(ValueError, match=r"data.augment flip .* have shape \(16,\)"):
        Reader(DataSettings(augment="flip"), DataShape((16,), 26))


TRANSFORM = """
import torch

def noisy(inputs, targets, generator):
    return inputs + torch.randn(inputs.shape, generator=generator), targets

def wrong(inputs, targets, generator):
    return inputs
"""


def test_a_transform_plugin_shapes_each_batch_with_the_units_generator(plugin_module):
    plugins.allow(["my_transforms"], plugin_module("my_transforms", TRANSFORM))
    settings = DataSettings(transform="my_transforms:noisy")
    first, again = _read(settings, 3), _read(settings, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], _take(np.arange(4))[0])
    with pytest.raises(PluginError, match="transform my_transforms:wrong must return"):
        _read(DataSettings(transform="my_transforms:wrong"), 3)


def test_a_transform_not_allowed_is_refused_with_the_flag():
    with pytest.raises(PluginError, match="--plugins elsewhere"):
        Reader(DataSettings(transform="elsewhere:noisy"), IMAGES)


def test_given_statistics_normalise_both_parts_and_are_kept_for_new_data():
    plain = load_data("mnist", MNIST, DataSettings())
    given = load_data("mnist", MNIST, DataSettings(mean=[0.5], std=[0.25]))
    index = np.arange(5)
    expected = (plain.train.take(index)[0] - 0.5) / 0.25
    assert torch.allclose(given.train.take(index)[0], expected)
    assert torch.allclose(given.validation.take(index)[0],
                          (plain.validation.take(index)[0] - 0.5) / 0.25)
    assert given.record["normalize"] == {"per": "channel", "mean": [0.5], "std": [0.25]}
    again = preprocessing.normalized(plain.train.take(index)[0], given.record)
    assert torch.equal(again, given.train.take(index)[0])  # predict reads as training did


def test_the_fingerprint_ignores_how_batches_are_shaped_but_not_the_statistics():
    plain = load_data("mnist", MNIST, DataSettings())
    shaped = load_data("mnist", MNIST, DataSettings(augment="flip", prefetch=2))
    normalised = load_data("mnist", MNIST, DataSettings(mean=[0.5], std=[0.25]))
    assert plain.fingerprint == shaped.fingerprint != normalised.fingerprint


@pytest.mark.parametrize(("raw", "message"), [
    ({"augment": "rotate"}, "data.augment must be one of none, flip, crop, crop_flip"),
    ({"mean": [0.5]}, "data.mean and data.std must give one value per channel"),
    ({"mean": [0.5], "std": [0.0]}, "data.std must be positive"),
    ({"mean": ["a"], "std": [1.0]}, "data.mean must be a list of numbers"),
    ({"mean": [0.5], "std": [1.0], "normalize": True}, "set one of the two"),
    ({"transform": "noisy"}, "data.transform must be a plug-in module:function"),
    ({"prefetch": -1}, r"data.prefetch must be in 0..64"),
])
def test_a_bad_batch_setting_is_refused_in_one_line(raw, message):
    with pytest.raises(DataSettingsError, match=message):
        DataSettings.from_mapping(raw)


def test_per_channel_statistics_of_a_table_are_refused():
    with pytest.raises(DataError, match="it holds examples of shape"):
        load_data("letters", DEFAULT_DATA_ROOT / "letters",
                  DataSettings(format="letters", mean=[0.0], std=[1.0]))


def test_a_units_augmented_training_is_reproducible_and_differs_between_rounds():
    settings = DataSettings(augment="crop_flip")
    data = load_data("mnist", MNIST, settings)
    setup = ModelSetup("mlp_classifier", ModelSettings({"hidden": [8]}), data,
                       objectives.cross_entropy, objectives.error_rate,
                       Reader(settings, data.shape), settings)

    def trained(round_index: int) -> dict[str, np.ndarray]:
        local = LocalSteps("sgd", lr=0.1, batch_size=32, epochs=1,
                           seed=unit_seed(1, round_index, "shard0-0-64"), round=round_index)
        return train_locally(setup, setup.build(seed=1), np.arange(64), local)[0]

    first, again, later = trained(1), trained(1), trained(2)
    assert all(np.array_equal(first[n], again[n]) for n in first)
    assert any(not np.array_equal(first[n], later[n]) for n in first)
