"""Image folders: recursive sorted listing, RGB conversion, resize + centre crop, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from thrift_trainer.training.data.image_folder import (
    ImageFolder,
    ImageFolderError,
    list_images,
    load_image,
)

torch.set_num_threads(1)

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def stripes(width: int, height: int, colours: list[tuple[int, int, int]],
            vertical: bool = True) -> Image.Image:
    """Equal stripes of the given colours, side by side (or stacked)."""
    pixels = np.zeros((height, width, 3), np.uint8)
    for index, colour in enumerate(colours):
        if vertical:
            step = width // len(colours)
            pixels[:, index * step:(index + 1) * step] = colour
        else:
            step = height // len(colours)
            pixels[index * step:(index + 1) * step, :] = colour
    return Image.fromarray(pixels)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Mixed sizes, modes and formats, in sub-folders, with a file that is no image."""
    (tmp_path / "b" / "deep").mkdir(parents=True)
    stripes(60, 20, [RED, GREEN, BLUE]).save(tmp_path / "wide.png")
    stripes(20, 60, [RED, GREEN, BLUE], vertical=False).save(tmp_path / "b" / "tall.JPG",
                                                            quality=95)
    Image.new("L", (30, 50), 128).save(tmp_path / "b" / "deep" / "grey.jpeg")
    Image.new("RGBA", (10, 10), (0, 0, 255, 100)).save(tmp_path / "a.png")
    stripes(40, 40, [GREEN]).convert("P").save(tmp_path / "b" / "palette.png")
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path


def test_listing_is_recursive_sorted_and_filtered(folder):
    names = [p.relative_to(folder).as_posix() for p in list_images(folder)]
    assert names == ["a.png", "b/deep/grey.jpeg", "b/palette.png", "b/tall.JPG", "wide.png"]


def test_load_range_shapes_and_values(folder):
    images = ImageFolder(folder, size=16)
    assert len(images) == 5
    batch = images.load_range(0, 5)
    assert batch.shape == (5, 3, 16, 16) and batch.dtype == torch.float32
    assert batch.min() >= -1.0 and batch.max() <= 1.0
    assert torch.equal(torch.cat([images.load_range(0, 2), images.load_range(2, 5)]), batch)
    grey = batch[1]
    assert torch.allclose(grey, torch.full_like(grey, 128 / 127.5 - 1), atol=0.02)
    assert ImageFolder(folder).load_range(4, 5).shape == (1, 3, 64, 64)


def test_wide_and_tall_images_keep_their_centre(folder):
    for name in ("wide.png", "b/tall.JPG"):
        pixels = load_image(folder / name, size=8).astype(int)
        assert pixels.shape == (8, 8, 3)
        # 60x20 -> 24x8 -> the middle 8 columns: the green stripe (bicubic edges aside).
        assert np.abs(pixels[2:6, 2:6] - np.array(GREEN)).max() < 16, name


def test_crop_is_exactly_centred_without_resizing(tmp_path):
    columns = np.tile(np.arange(16, dtype=np.uint8) * 10, (8, 1))
    Image.fromarray(np.stack([columns] * 3, axis=-1)).save(tmp_path / "ramp.png")
    pixels = load_image(tmp_path / "ramp.png", size=8)
    assert pixels[:, :, 0].tolist() == [list(range(40, 120, 10))] * 8


def test_empty_or_missing_folder(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "readme.txt").write_text("no images")
    with pytest.raises(ImageFolderError, match="no PNG or JPEG images under"):
        ImageFolder(tmp_path / "empty")
    with pytest.raises(ImageFolderError, match="does not exist"):
        ImageFolder(tmp_path / "nowhere")


def test_unreadable_images_are_named(folder):
    (folder / "z_garbage.png").write_bytes(b"this is not a png")
    good = (folder / "wide.png").read_bytes()
    (folder / "z_truncated.png").write_bytes(good[: len(good) // 2])
    images = ImageFolder(folder)
    for index, name in ((5, "z_garbage.png"), (6, "z_truncated.png")):
        with pytest.raises(ImageFolderError, match=f"{name}: cannot read the image"):
            images.load_range(index, index + 1)


@pytest.mark.parametrize("start, stop", [(0, 0), (3, 6), (-1, 2)])
def test_bad_ranges_are_refused(folder, start, stop):
    with pytest.raises(ValueError, match="index range"):
        ImageFolder(folder).load_range(start, stop)
