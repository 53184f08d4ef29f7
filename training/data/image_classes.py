"""A folder of labelled images: one subfolder per class, PNG or JPEG, grey or RGB.

Classes are the subfolders' names in sorted order (so class numbers agree on every node);
images are resized (short side) and centre-cropped to a square of ``size`` pixels and
scaled to [-1, 1], as training/data/mnist.py does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from thrift_trainer.training.data.image_folder import (
    ImageFolderError,
    _resize_and_crop,
    list_images,
)


@dataclass(frozen=True)
class LabelledImages:
    images: np.ndarray  # (n, channels, size, size) float32 in [-1, 1]
    labels: np.ndarray  # (n,) int64
    classes: tuple[str, ...]
    files: tuple[Path, ...]  # in example order, for the data set's fingerprint


def read_class_folders(folder: Path, size: int, channels: int,
                       classes: tuple[str, ...] | None = None) -> LabelledImages:
    """Every image under ``folder``'s class subfolders; ``classes``: the training part's,
    so that a validation folder numbers its classes the same way."""
    found = tuple(sorted(p.name for p in folder.iterdir() if p.is_dir())) \
        if folder.is_dir() else ()
    if not found:
        raise ImageFolderError(f"{folder} has no class subfolders (one folder per class "
                               "holding its images)")
    order = classes or found
    unknown = sorted(set(found) - set(order))
    if unknown:
        raise ImageFolderError(f"{folder}: class {unknown[0]!r} is not a class of the "
                               "training part")
    files, labels = [], []
    for number, name in enumerate(order):
        if name in found:
            paths = list_images(folder / name)
            files += paths
            labels += [number] * len(paths)
    pixels = np.stack([load_scaled(path, size, channels) for path in files])
    return LabelledImages(pixels, np.array(labels, dtype=np.int64), order, tuple(files))


def load_scaled(path: Path, size: int, channels: int) -> np.ndarray:
    """One image as (channels, size, size) float32 in [-1, 1], as training reads it."""
    try:
        with Image.open(path) as image:
            converted = image.convert("L" if channels == 1 else "RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageFolderError(f"{path}: cannot read the image ({exc})") from None
    pixels = np.asarray(_resize_and_crop(converted, size), dtype=np.float32)
    pixels = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
    return pixels / np.float32(127.5) - np.float32(1.0)
