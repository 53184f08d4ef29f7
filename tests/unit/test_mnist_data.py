"""MNIST IDX reading, the fixed training/held-out split and index-range work units."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from thrift_trainer.training.data import mnist
from thrift_trainer.training.data.mnist import IdxFormatError, read_idx

torch.set_num_threads(1)

TYPE_CODES = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, TYPE_CODES[array.dtype], array.ndim])
    return header + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip_plain_and_gzip(tmp_path, gz):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "x.idx", images, gz)), images)
    counts = np.array([1, -2, 300000], dtype=">i4")
    read = read_idx(write_idx(tmp_path / "y.idx", counts, gz))
    assert read.tolist() == [1, -2, 300000] and read.dtype.isnative


@pytest.mark.parametrize("data, problem", [
    (b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", "bad magic number"),
    (b"\x00\x00\x42\x01\x00\x00\x00\x01\x07", "unknown IDX type code 0x42"),
    (b"\x00\x00", "bad magic number"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x02", "truncated"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x03\x07\x07", "needs 3 bytes of data but the file has 2"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x01\x07\x07", "needs 1 bytes of data but the file has 2"),
])
def test_idx_errors_name_the_file(tmp_path, data, problem):
    path = tmp_path / "broken-idx"
    path.write_bytes(data)
    with pytest.raises(IdxFormatError, match=problem) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_truncated_gzip_is_reported(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((50, 28, 28), np.uint8)))[:-20])
    with pytest.raises(IdxFormatError, match="gzip") as info:
        read_idx(path)
    assert "images.gz" in str(info.value)


def test_load_mnist_checks_labels_against_images(tmp_path):
    write_idx(tmp_path / mnist.IMAGES_FILE, np.zeros((3, 28, 28), np.uint8), gz=True)
    write_idx(tmp_path / mnist.LABELS_FILE, np.zeros(2, np.uint8), gz=True)
    with pytest.raises(IdxFormatError, match="expected 3 labels") as info:
        mnist.load_mnist(tmp_path)
    assert mnist.LABELS_FILE in str(info.value)


def test_load_mnist_reads_the_files_again_once_they_changed(tmp_path):
    """A node serves for days: a replaced copy is read again, not the one it cached."""
    for count in (3, 5):
        write_idx(tmp_path / mnist.IMAGES_FILE, np.zeros((count, 28, 28), np.uint8), gz=True)
        write_idx(tmp_path / mnist.LABELS_FILE, np.zeros(count, np.uint8), gz=True)
        assert len(mnist.load_mnist(tmp_path)[0]) == count


def test_load_mnist_checks_image_size(tmp_path):
    write_idx(tmp_path / mnist.IMAGES_FILE, np.zeros((3, 8, 8), np.uint8), gz=True)
    write_idx(tmp_path / mnist.LABELS_FILE, np.zeros(3, np.uint8), gz=True)
    with pytest.raises(IdxFormatError, match="28x28") as info:
        mnist.load_mnist(tmp_path)
    assert mnist.IMAGES_FILE in str(info.value)


def test_shipped_mnist_loads_read_only():
    images, labels = mnist.load_mnist()
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10_000,) and labels.dtype == np.int64
    assert labels[:5].tolist() == [7, 2, 1, 0, 4]  # the canonical first test labels
    assert set(np.unique(labels).tolist()) == set(range(10))
    with pytest.raises(ValueError):
        images[0, 0, 0] = 1


def test_split_is_fixed_disjoint_and_alternates_halves():
    train, held_out = mnist.split_indices()
    assert len(train) == mnist.N_TRAIN == 8_000 and len(held_out) == mnist.N_HELD_OUT == 2_000
    assert np.array_equal(np.sort(np.concatenate([train, held_out])), np.arange(10_000))
    assert np.all(held_out % 5 == 4)
    assert held_out[:4].tolist() == [4, 5004, 9, 5009]
    assert train[:6].tolist() == [0, 5000, 1, 5001, 2, 5002]
    # Every prefix mixes the file's two writer populations equally.
    assert np.mean(train[:1000] < 5000) == 0.5 and np.mean(held_out[:500] < 5000) == 0.5


def test_parts_follow_the_split():
    images, labels = mnist.load_mnist()
    train, held_out = mnist.split_indices()
    train_images, train_labels = mnist.training_part()
    held_images, held_labels = mnist.held_out_part()
    assert np.array_equal(train_images, images[train])
    assert np.array_equal(train_labels, labels[train])
    assert np.array_equal(held_images, images[held_out])
    assert np.array_equal(held_labels, labels[held_out])


def test_training_range_is_a_scaled_slice_of_the_training_part():
    images, _ = mnist.training_part()
    unit = mnist.training_range(100, 164)
    assert unit.shape == (64, 1, 28, 28) and unit.dtype == torch.float32
    expected = images[100:164].astype(np.float32) / 127.5 - 1.0
    assert np.array_equal(unit[:, 0].numpy(), expected)
    assert unit.min() == -1.0 and unit.max() == 1.0
    whole = mnist.training_range(0, 200)
    assert torch.equal(torch.cat([mnist.training_range(0, 100), unit,
                                  mnist.training_range(164, 200)]), whole)
    assert mnist.training_range(7_990, 8_000).shape[0] == 10


def test_pixels_map_exactly_to_minus_one_and_one():
    values = mnist.pixels_to_tensor(np.array([0, 255, 51], np.uint8))
    assert values[0] == -1.0 and values[1] == 1.0 and values[2] == pytest.approx(-0.6)


@pytest.mark.parametrize("start, stop", [(5, 5), (10, 3), (-1, 10), (0, 8_001), (0.0, 10),
                                         (True, 4)])
def test_bad_ranges_are_refused(start, stop):
    with pytest.raises(ValueError, match="index range"):
        mnist.training_range(start, stop)
