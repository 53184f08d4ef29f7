"""MNIST from IDX files, with a fixed split into a training part and a held-out part.

Only the 10,000 MNIST *test* images ship with the project (``data/mnist/``), so they serve
as the GAN training set and a fixed part of them is held out for evaluation statistics
(FID/IS reference, classifier accuracy):

* held-out part: the images whose file index i has i % 5 == 4 (2,000 images);
* training part: the other 8,000.

The file is not homogeneous: its first 5,000 images come from NIST's cleaner SD-3 writers
and the last 5,000 from the harder SD-1 writers (FID between the two is ~30 with the
shipped classifier, against a floor of a few units). So each part takes the same share of
both halves, and each part is *ordered* by alternating between the halves (held-out: 4,
5004, 9, 5009, ...; training: 0, 5000, 1, 5001, 2, 5002, 3, 5003, 5, 5005, ...): any
prefix (the first n reference images) and any index range (a work unit) then mixes both
populations equally. No random permutation is used, so the split needs no seed and cannot
change with a numpy version.

A compute node loads a *work unit* as an index range ``[start, stop)`` of the training
part with :func:`training_range`; every process reads the same bytes into the same order.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
from pathlib import Path

import numpy as np
import torch

from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT, files_stamp

DEFAULT_MNIST_DIR = DEFAULT_DATA_ROOT / "mnist"
IMAGES_FILE = "t10k-images-idx3-ubyte.gz"
LABELS_FILE = "t10k-labels-idx1-ubyte.gz"
IMAGE_SIDE = 28
N_IMAGES = 10_000
HELD_OUT_EVERY = 5  # file index i is held out when i % 5 == 4
N_HELD_OUT = N_IMAGES // HELD_OUT_EVERY
N_TRAIN = N_IMAGES - N_HELD_OUT

# The IDX type byte -> numpy dtype; multi-byte values are big-endian in the format.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


class IdxFormatError(ValueError):
    """A file that is not a well-formed IDX file (or not the expected one); names the file."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        self.problem = problem


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file, gzipped or not (told by its first bytes, not its name).

    The header is checked against the payload size, so a truncated download or a file with
    trailing bytes fails here, naming the file, instead of yielding shifted images.
    """
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise IdxFormatError(path, "bad magic number: an IDX file starts with two zero bytes")
    dtype = _IDX_DTYPES.get(raw[2])
    if dtype is None:
        raise IdxFormatError(path, f"bad magic number: unknown IDX type code 0x{raw[2]:02x}")
    ndim = raw[3]
    header_size = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header_size:
        raise IdxFormatError(path, f"header of {ndim} dimensions is missing or truncated")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = math.prod(shape) * dtype.itemsize
    actual = len(raw) - header_size
    if actual != expected:
        raise IdxFormatError(
            path, f"shape {shape} needs {expected} bytes of data but the file has {actual}"
            + (" (truncated)" if actual < expected else "")
        )
    return np.frombuffer(raw, dtype=dtype, offset=header_size).reshape(shape).astype(
        dtype.newbyteorder("=")
    )


def _read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed when it is gzip; a broken gzip stream names the file."""
    raw = Path(path).read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise IdxFormatError(path, f"corrupt or truncated gzip data ({exc})") from None


def load_mnist(root: str | os.PathLike = DEFAULT_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """All 10,000 images (n, 28, 28) uint8 and labels (n,) int64 from the folder ``root``.

    Parsed once per folder and cached (a node loads many work units) until either file's
    size or modification time changes; the arrays are read-only so that no caller can
    corrupt another's data.
    """
    folder = Path(root).resolve()
    return _load_cached(str(folder), files_stamp(folder / IMAGES_FILE, folder / LABELS_FILE))


@functools.lru_cache(maxsize=4)
def _load_cached(root: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
    images_path, labels_path = Path(root) / IMAGES_FILE, Path(root) / LABELS_FILE
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise IdxFormatError(images_path, f"expected uint8 images of 28x28, got "
                                          f"{images.dtype} {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise IdxFormatError(labels_path, f"expected {len(images)} labels (one per image), "
                                          f"got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise IdxFormatError(labels_path, "labels must be digits 0..9")
    labels = labels.astype(np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def split_indices(n_images: int = N_IMAGES) -> tuple[np.ndarray, np.ndarray]:
    """File indices of the training part and of the held-out part, in their fixed order
    (alternating between the first and second half of the file; see the module doc)."""
    if n_images % (2 * HELD_OUT_EVERY):
        raise ValueError(f"the split needs a multiple of {2 * HELD_OUT_EVERY} images, "
                         f"got {n_images}")
    order = np.arange(n_images).reshape(2, -1).T.ravel()  # 0, n/2, 1, n/2 + 1, ...
    held_out = order % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    return order[~held_out], order[held_out]


def training_part(root: str | os.PathLike = DEFAULT_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """The 8,000 training images (uint8) and labels, in the split's order."""
    images, labels = load_mnist(root)
    train, _ = split_indices(len(images))
    return images[train], labels[train]


def held_out_part(root: str | os.PathLike = DEFAULT_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """The 2,000 held-out images (uint8) and labels in the split's order, used only for
    evaluation."""
    images, labels = load_mnist(root)
    _, held_out = split_indices(len(images))
    return images[held_out], labels[held_out]


def check_index_range(start: int, stop: int, size: int, what: str) -> None:
    """Refuse a range that is empty or outside ``[0, size)``: a node must never train on less
    than it was asked for because a slice silently clipped."""
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
               for i in (start, stop)):
        raise ValueError(f"index range of {what} must be integers, got {start!r}, {stop!r}")
    if not 0 <= start < stop <= size:
        raise ValueError(
            f"index range [{start}, {stop}) is not a non-empty range inside {what} "
            f"of {size} images; use 0 <= start < stop <= {size}"
        )


def pixels_to_tensor(pixels: np.ndarray) -> torch.Tensor:
    """uint8 pixels -> float32 tensor in [-1, 1] (0 -> -1, 255 -> 1), the range of a tanh G."""
    return torch.from_numpy(pixels.astype(np.float32) / np.float32(127.5) - np.float32(1.0))


def to_model_input(images: np.ndarray) -> torch.Tensor:
    """(n, 28, 28) uint8 -> (n, 1, 28, 28) float32 in [-1, 1]."""
    return pixels_to_tensor(np.ascontiguousarray(images)[:, None, :, :])


def training_range(start: int, stop: int,
                   root: str | os.PathLike = DEFAULT_MNIST_DIR) -> torch.Tensor:
    """Images ``[start, stop)`` of the training part as (n, 1, 28, 28) float32 in [-1, 1]:
    how a node loads a work unit."""
    images, _ = load_mnist(root)
    train, _ = _split_of(len(images))
    check_index_range(start, stop, len(train), "the MNIST training part")
    # Only the range's images are gathered: `training_part` copies all 8,000 (about 1 ms,
    # on every unit's critical path).
    return to_model_input(images[train[start:stop]])


@functools.lru_cache(maxsize=4)
def _split_of(n_images: int) -> tuple[np.ndarray, np.ndarray]:
    """`split_indices`, computed once per size and read-only."""
    train, held_out = split_indices(n_images)
    train.flags.writeable = False
    held_out.flags.writeable = False
    return train, held_out
