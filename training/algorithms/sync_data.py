"""A data set's training part as sync_sgd's units see it: its size, the file that holds a
given sample (a unit's ``unit_path``, which the node's handler checks), and the samples
of an index range. Read once per process: a node serves many units of one data set."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.algorithms.letters_files import train_files
from thrift_trainer.training.data import image_folder, mnist
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import folder_stamp
from thrift_trainer.training.gan_training import PROBE_SIZE
from thrift_trainer.training.models import gan_models


class LettersPart:
    """The letters training part: the ``train_*`` files concatenated in natural order."""

    def __init__(self, folder: Path) -> None:
        files = train_files(folder)
        if not files:
            raise ConfigError(f"no train_* files in {folder}: the MLP trains on them")
        parts = [load_letters(path) for path in files]
        self.features = np.concatenate([x for x, _ in parts])
        self.labels = np.concatenate([y for _, y in parts])
        self.ends = np.cumsum([len(y) for _, y in parts])
        self.names = [p.name for p in files]

    def __len__(self) -> int:
        return len(self.labels)

    def path_of(self, index: int) -> str:
        return self.names[int(np.searchsorted(self.ends, index, side="right"))]

    def load(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        mnist.check_index_range(start, stop, len(self), "the letters training part")
        return self.features[start:stop], self.labels[start:stop]


class MnistPart:
    """The MNIST training part (8,000 images); every unit lies in the images file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.size = len(mnist.training_part(folder)[0])

    def __len__(self) -> int:
        return self.size

    def path_of(self, index: int) -> str:
        return mnist.IMAGES_FILE

    def load(self, start: int, stop: int) -> torch.Tensor:
        return mnist.training_range(start, stop, self.folder)

    def probe(self) -> torch.Tensor:
        return mnist.to_model_input(mnist.held_out_part(self.folder)[0][:PROBE_SIZE])


class FolderPart:
    """An image folder at 64x64; a unit is named by the relative path of its first image."""

    def __init__(self, folder: Path) -> None:
        self.images = image_folder.ImageFolder(folder)

    def __len__(self) -> int:
        return len(self.images)

    def path_of(self, index: int) -> str:
        return self.images.paths[index].relative_to(self.images.folder).as_posix()

    def load(self, start: int, stop: int) -> torch.Tensor:
        return self.images.load_range(start, stop)

    def probe(self) -> torch.Tensor:
        return self.images.load_range(0, min(PROBE_SIZE, len(self.images)))


class Examples:
    """A torch model's training part as the units see it: index ranges, no files."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def path_of(self, index: int) -> str:
        return ""


TrainingPart = LettersPart | MnistPart | FolderPart


def training_part(model: str, folder: Path) -> TrainingPart:
    """The training part of the data set in ``folder`` that ``model`` trains on."""
    return _read(model, str(folder.resolve()), folder_stamp(folder))


@functools.lru_cache(maxsize=4)
def _read(model: str, folder: str, stamp: tuple) -> TrainingPart:
    try:
        if model == "mlp":
            return LettersPart(Path(folder))
        if gan_models.is_mnist_model(model):
            return MnistPart(Path(folder))
        return FolderPart(Path(folder))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data set {folder} cannot serve model {model!r}: {exc}") from exc
