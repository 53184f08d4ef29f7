"""Saving and loading a trained model: its weights plus a JSON description, in one .npz."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

_DESCRIPTION_KEY = "__model__"


class ModelFileError(ValueError):
    """A file that is not a model saved by this project."""


def save_model(path: str | os.PathLike, weights: Mapping[str, np.ndarray],
               description: Mapping[str, Any]) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a model."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    arrays = dict(weights)
    arrays[_DESCRIPTION_KEY] = np.array(json.dumps(dict(description)))
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_model(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The weights and the description of a saved model."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} not found") from None
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path} is not a model file: {exc}") from None
    if _DESCRIPTION_KEY not in arrays:
        raise ModelFileError(f"{path} has no model description; was it saved by this trainer?")
    description = json.loads(str(arrays.pop(_DESCRIPTION_KEY)))
    return arrays, description
