"""Saving and loading a trained model: its weights plus a JSON description, in one .npz."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from thrift_trainer.training.outputs.checked_npz import ArrayFileError, read_npz

_DESCRIPTION_KEY = "__model__"
# A run's checkpoint keeps the algorithm's optimizer state beside the weights, its
# arrays named with this prefix (coordinator/checkpoint.py).
OPTIMIZER_PREFIX = "optimizer."
_ZIP_MAGIC = b"PK\x03\x04"  # how every .npz (a zip archive) begins
DESCRIPTION_BYTES = 1 << 20  # room for the description (JSON) beside a bounded model


class ModelFileError(ValueError):
    """A file that is not a model saved by this project."""


def save_model(path: str | os.PathLike, weights: Mapping[str, np.ndarray],
               description: Mapping[str, Any]) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a model."""
    arrays = dict(weights)
    arrays[_DESCRIPTION_KEY] = np.array(json.dumps(dict(description)))
    return write_atomically(path, lambda f: np.savez(f, **arrays))


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """``write`` into a temporary file beside ``path``, then rename it over ``path``, so a
    crash never leaves half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_model(path: str | os.PathLike, max_bytes: int | None = None,
               keep: Callable[[str], bool] | None = None
               ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The weights (those ``keep`` keeps, at most ``max_bytes`` besides the description) and
    the description of a saved model; ModelFileError names the file and what is wrong with
    it (missing, truncated, not an .npz, arrays claiming more than it holds, no or a
    damaged description)."""
    arrays = _read_arrays(path, None if max_bytes is None else max_bytes + DESCRIPTION_BYTES,
                          lambda name: name == _DESCRIPTION_KEY or keep is None or keep(name))
    if _DESCRIPTION_KEY not in arrays:
        raise ModelFileError(f"{path} has no model description; was it saved by this trainer?")
    try:
        description = json.loads(str(arrays.pop(_DESCRIPTION_KEY)))
    except ValueError:
        raise ModelFileError(f"{path} is damaged: its model description is not JSON") from None
    if not isinstance(description, dict):
        raise ModelFileError(f"{path} is damaged: its model description is not a JSON object")
    return arrays, description


def _read_arrays(path: str | os.PathLike, max_bytes: int | None = None,
                 keep: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the .npz at `path` (those ``keep`` keeps), read in full so that damage
    shows here; none whose header declares more than the file holds, nor more than
    ``max_bytes`` in all."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} not found") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror}") from None
    if magic != _ZIP_MAGIC:
        raise ModelFileError(f"{path} is not a model file: not an .npz archive "
                             f"({'empty' if not magic else 'damaged or another kind of file'})")
    try:
        return read_npz(path, str(path), max_bytes=max_bytes, keep=keep)
    except ArrayFileError as exc:  # a header claiming more than the file holds among them
        raise ModelFileError(str(exc)) from None


def without_optimizer(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's own weights of a saved file: a checkpoint's optimizer state left out."""
    return {k: v for k, v in arrays.items() if not k.startswith(OPTIMIZER_PREFIX)}
