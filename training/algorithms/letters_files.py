"""The files of a letters data set as the MLP's algorithms read them: the ``train_*``
files in natural order (train_letters2 before train_letters10) and the first
``validate_*`` file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.data.letters import load_letters


def train_files(folder: Path) -> list[Path]:
    """The ``train_*`` files of ``folder`` in natural order; none when it holds none."""
    files = [p for p in folder.glob("train_*") if p.is_file()]
    return sorted(files, key=lambda p: _natural_key(p.name))


def validation_data(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of the validation file; ConfigError when there is none."""
    files = sorted(p for p in folder.glob("validate_*") if p.is_file())
    if not files:
        raise ConfigError(f"no validate_* file in {folder}: the validation set is needed")
    return load_letters(files[0])


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
