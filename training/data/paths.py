"""Resolving data-set names and unit files under a data root, without escaping it."""

from __future__ import annotations

import os
from pathlib import Path

_TOP = Path(__file__).resolve().parents[2]
# The repository's folder when the trainer runs from a checkout; None when it is installed
# (the folder above its packages is site-packages).
CHECKOUT = _TOP if (_TOP / "scripts" / "setup.sh").is_file() else None


def _default_data_root() -> Path:
    """$TRAINER_DATA_ROOT; else, in a checkout, its data folder (letters and MNIST ship
    there); else, for an installed trainer, ./data."""
    if os.environ.get("TRAINER_DATA_ROOT"):
        return Path(os.environ["TRAINER_DATA_ROOT"])
    return (CHECKOUT or Path.cwd()) / "data"


# The default data root of every process (--data-root changes it).
DEFAULT_DATA_ROOT = _default_data_root()


class DataPathError(ValueError):
    """A data set or unit file that is missing or lies outside the data root."""


def resolve_under(root: str | os.PathLike, *parts: str) -> Path:
    """Join parts under root and refuse any result outside root (.., absolute paths, links)."""
    base = Path(root).resolve()
    for part in parts:
        if not part or "\x00" in part:
            raise DataPathError(f"empty or invalid path component {part!r}")
    candidate = base.joinpath(*parts).resolve()
    if candidate != base and base not in candidate.parents:
        joined = "/".join(parts)
        raise DataPathError(f"path {joined!r} escapes the data root {base}; use a name inside it")
    return candidate


def dataset_dir(root: str | os.PathLike, dataset: str) -> Path:
    """The folder of a data set under the data root; it must exist."""
    path = resolve_under(root, dataset)
    if not path.is_dir():
        raise DataPathError(
            f"data set directory {path} does not exist; "
            f"pass a folder name under the data root {Path(root).resolve()} or set --data-root"
        )
    return path


def data_location(root: str | os.PathLike, dataset: str) -> Path:
    """Where a run's data set is read from: its folder under the data root (which must
    exist), or the data root itself for a plug-in data set (``module:function``), which
    finds its own files there."""
    if ":" in dataset:
        return Path(root).resolve()
    return dataset_dir(root, dataset)
