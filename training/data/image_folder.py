"""Any folder of PNG/JPEG images as a data set of SxS RGB images in [-1, 1] (Pillow only).

Images are found recursively and sorted by their path relative to the folder (as POSIX
text), so every machine holding a copy of the folder numbers the images identically and
an index range ``[start, stop)`` names the same work unit everywhere. Each image is
converted to RGB (greyscale and palette images are expanded, an alpha channel is dropped),
resized so that its short side is S (bicubic, antialiased), and centre-cropped to SxS, as
the DCGAN-64 training recipe does.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from thrift_trainer.training.data.mnist import check_index_range, pixels_to_tensor

EXTENSIONS = frozenset({".png", ".jpg", ".jpeg"})
DEFAULT_SIZE = 64


class ImageFolderError(ValueError):
    """An image folder that holds no images, or an image that cannot be read."""


def list_images(folder: str | os.PathLike) -> list[Path]:
    """PNG/JPEG files under ``folder`` (any depth, extension case ignored), sorted by
    relative path; symbolic links to folders are not followed, so a loop cannot hang."""
    root = Path(folder)
    if not root.is_dir():
        raise ImageFolderError(f"image folder {root} does not exist or is not a folder")
    found = [Path(dirpath, name)
             for dirpath, _, names in os.walk(root)
             for name in names if Path(name).suffix.lower() in EXTENSIONS]
    if not found:
        raise ImageFolderError(f"no PNG or JPEG images under {root}")
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def load_image(path: str | os.PathLike, size: int = DEFAULT_SIZE) -> np.ndarray:
    """One image as (size, size, 3) uint8: RGB, short side resized to ``size``, centre crop.

    Any decoding problem (not an image, truncated data) is reported naming the file.
    """
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageFolderError(f"{os.fspath(path)}: cannot read the image ({exc})") from None
    return np.asarray(_resize_and_crop(rgb, size))


def _resize_and_crop(image: Image.Image, size: int) -> Image.Image:
    width, height = image.size
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    if new_size != image.size:
        image = image.resize(new_size, Image.Resampling.BICUBIC)
    left, top = (new_size[0] - size) // 2, (new_size[1] - size) // 2
    return image.crop((left, top, left + size, top + size))


class ImageFolder:
    """The sorted images of a folder; lists the folder once, decodes on demand."""

    def __init__(self, folder: str | os.PathLike, size: int = DEFAULT_SIZE) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"image size must be a positive int, got {size!r}")
        self.folder = Path(folder)
        self.size = size
        self.paths = list_images(folder)

    def __len__(self) -> int:
        return len(self.paths)

    def load_range(self, start: int, stop: int) -> torch.Tensor:
        """Images ``[start, stop)`` as (n, 3, S, S) float32 in [-1, 1]: a work unit."""
        check_index_range(start, stop, len(self.paths), f"the image folder {self.folder}")
        pixels = np.stack([load_image(path, self.size) for path in self.paths[start:stop]])
        return pixels_to_tensor(pixels.transpose(0, 3, 1, 2))
