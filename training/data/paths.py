"""Resolving data-set names and unit files under a data root, without escaping it."""

from __future__ import annotations

import os
from pathlib import Path

# The repository's own data folder: the default data root of every process.
DEFAULT_DATA_ROOT = Path(__file__).resolve().parents[2] / "data"


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
