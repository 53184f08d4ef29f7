"""How a torch model's examples were read and preprocessed: recorded, then applied again.

Training reads its data set in a built-in format (training/data/datasets.py) and may
preprocess it. The record of that travels in the model file's description under ``data``
(``model.npz`` and ``model.safetensors`` alike), so that `client.py evaluate` and `predict`
read new data exactly as training read its own:

* ``format``: letters, mnist, csv, tsv, images or arrays (``plugin``: a plug-in data set,
  whose reading is its own code and is not repeated).
* ``label_names``: the label text of each class number, when there is one: the words of a
  table's label column (sorted), the class folders of images, A..Z for letters.
* ``normalize``: ``{"mean": ..., "std": ...}`` per feature (per input element), the
  training part's statistics that ``data.normalize`` applied: ``(x - mean) / std``; or,
  with ``"per": "channel"``, one value per image channel (``data.mean`` / ``data.std``).
* tables: ``label`` (the ``data.label`` setting), ``label_column`` (its 0-based index in
  the file), ``header``, ``columns`` (the feature columns' names from a header, or None)
  and ``features`` (how many).
* images and MNIST: ``image_size`` (short side resized, centre-cropped square),
  ``channels`` (1 grey, 3 RGB) and ``pixels``: ``[-1, 1]``, a pixel value v becomes
  v / 127.5 - 1.
* arrays: ``inputs`` and ``targets``, the keys of an .npz file.
"""

from __future__ import annotations

import csv
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thrift_trainer.training.data import mnist
from thrift_trainer.training.data.image_classes import load_scaled, read_class_folders
from thrift_trainer.training.data.image_folder import ImageFolderError, list_images
from thrift_trainer.training.data.letters import N_FEATURES, DataFormatError, load_letters
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.data.tables import Table, TableError, read_tables
from thrift_trainer.training.outputs.checked_npz import ArrayFileError, read_npz

PIXELS = "[-1, 1]"  # how every image format scales its pixels: v / 127.5 - 1
DELIMITERS = {"csv": ",", "tsv": "\t"}
# What a record needs, by format, for new data to be read as training read its own.
NEEDED = {"letters": (), "mnist": ("image_size", "channels", "pixels"),
          "csv": ("label", "label_column", "header", "columns", "features"),
          "tsv": ("label", "label_column", "header", "columns", "features"),
          "images": ("image_size", "channels", "pixels"), "arrays": ("inputs", "targets")}


class PreprocessingError(ValueError):
    """Data that cannot be read as the record says, or a record that cannot be used."""


# ------------------------------------------------------------------ records
def letters_record() -> dict[str, Any]:
    return {"format": "letters", "features": N_FEATURES,
            "label_names": list(string.ascii_uppercase)}


def mnist_record() -> dict[str, Any]:
    return {"format": "mnist", "image_size": mnist.IMAGE_SIDE, "channels": 1,
            "pixels": PIXELS, "label_names": None}


def table_record(kind: str, settings: DataSettings, train: Table) -> dict[str, Any]:
    return {"format": kind, "label": settings.label, "label_column": train.label_index,
            "header": settings.header,
            "columns": list(train.columns) if train.columns is not None else None,
            "features": int(train.features.shape[1]),
            "label_names": list(train.classes) if train.classes else None}


def image_record(settings: DataSettings, classes: tuple[str, ...]) -> dict[str, Any]:
    return {"format": "images", "image_size": settings.image_size,
            "channels": settings.channels, "pixels": PIXELS, "label_names": list(classes)}


def arrays_record(settings: DataSettings) -> dict[str, Any]:
    return {"format": "arrays", "inputs": settings.inputs, "targets": settings.targets,
            "label_names": None}


def plugin_record(dataset: str) -> dict[str, Any]:
    return {"format": "plugin", "dataset": dataset}


def normalization_record(mean: torch.Tensor, std: torch.Tensor) -> dict[str, Any]:
    """The statistics as JSON numbers: float32 values survive JSON exactly, so the data
    preprocessed again from the record matches training's bit for bit."""
    return {"normalize": {"mean": mean.tolist(), "std": std.tolist()}}


def channel_normalization_record(mean: list[float], std: list[float]) -> dict[str, Any]:
    """Given per-channel statistics of images (data.mean, data.std), as float32 values."""
    return {"normalize": {"per": "channel",
                          "mean": torch.tensor(mean, dtype=torch.float32).tolist(),
                          "std": torch.tensor(std, dtype=torch.float32).tolist()}}


def problem(record: Any) -> str | None:
    """What a record lacks for new data to be read from it (one phrase), or None."""
    if not isinstance(record, dict) or "format" not in record:
        return "the data record (format, preprocessing, label names)"
    kind = record["format"]
    if kind == "plugin":
        return (f"a built-in data format: it was trained on plug-in data set "
                f"{record.get('dataset')}, whose reading is its own code")
    if kind not in NEEDED:
        return f"a known data format (it records {kind!r})"
    missing = [key for key in NEEDED[kind] if key not in record]
    return f"the data record's {', '.join(missing)}" if missing else None


# ------------------------------------------------------------------ applying a record
def labelled(record: dict[str, Any], path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of labelled data at ``path`` in the record's format (a table
    file or a folder of them, a letters file, a folder of class folders, an MNIST folder,
    an .npz), preprocessed as training was."""
    inputs, targets = _read(_LABELLED, record, Path(path))
    return normalized(inputs, record), targets


def unlabelled(record: dict[str, Any], path: str | Path
               ) -> tuple[torch.Tensor, list[str] | None]:
    """Inputs at ``path`` (a table's rows, a label column ignored; images: one file or a
    folder, any depth), preprocessed as training was, and each image's path (None for
    rows)."""
    inputs, names = _read(_UNLABELLED, record, Path(path))
    return normalized(inputs, record), names


def normalized(inputs: torch.Tensor, record: dict[str, Any]) -> torch.Tensor:
    statistics = record.get("normalize")
    if not statistics:
        return inputs
    mean = torch.tensor(statistics["mean"], dtype=torch.float32)
    std = torch.tensor(statistics["std"], dtype=torch.float32)
    if statistics.get("per") == "channel":  # images: (n, C, H, W), one value a channel
        if inputs.dim() != 4 or inputs.shape[1] != len(mean):
            raise PreprocessingError(f"examples of shape {tuple(inputs.shape[1:])}, the "
                                     f"model's normalisation is for {len(mean)} channels")
        return (inputs - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    if inputs.shape[1:] != mean.shape:
        raise PreprocessingError(f"examples of shape {tuple(inputs.shape[1:])}, the model's "
                                 f"normalisation is for {tuple(mean.shape)}")
    return (inputs - mean) / std


def _read(readers: dict[str, Callable], record: dict[str, Any], path: Path) -> Any:
    why = problem(record)
    if why is not None:
        raise PreprocessingError(f"the model file lacks {why}")
    try:
        return readers[record["format"]](record, path)
    except (TableError, ImageFolderError, DataFormatError, ArrayFileError, ValueError) as exc:
        raise PreprocessingError(str(exc)) from None
    except OSError as exc:
        raise PreprocessingError(f"cannot read {path}: {exc.strerror or exc}") from None


def _table_files(record: dict[str, Any], path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    found = sorted(path.glob(f"*.{record['format']}"))
    if not found:
        raise PreprocessingError(f"no .{record['format']} files in {path}")
    return found


def _labelled_table(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    names = record.get("label_names")
    table = read_tables(_table_files(record, path), DELIMITERS[record["format"]],
                        record["label"], record["header"], tuple(names) if names else None)
    if table.features.shape[1] != record["features"]:
        raise PreprocessingError(f"{path}: {table.features.shape[1]} feature columns, the "
                                 f"model was trained on {record['features']}")
    if record["columns"] and table.columns and list(table.columns) != record["columns"]:
        raise PreprocessingError(f"{path}: feature columns {', '.join(table.columns)}; the "
                                 f"model was trained on {', '.join(record['columns'])}")
    return torch.from_numpy(table.features), torch.from_numpy(table.labels)


def _unlabelled_table(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, None]:
    rows: list[list[str]] = []
    for file in _table_files(record, path):
        with open(file, newline="", encoding="utf-8") as f:
            rows += [row for row in csv.reader(f, delimiter=DELIMITERS[record["format"]])
                     if any(cell.strip() for cell in row)]
    if not rows:
        raise PreprocessingError(f"{path} has no rows")
    header = record["header"] == "yes" or (record["header"] == "auto"
                                           and not all(_is_number(c) for c in rows[0]))
    chosen = _feature_indices(record, [c.strip() for c in rows[0]] if header else None,
                              len(rows[0]), path)
    return _numbers(rows[1:] if header else rows, chosen, path, 2 if header else 1), None


def _feature_indices(record: dict[str, Any], names: list[str] | None, width: int,
                     path: Path) -> list[int]:
    """Which columns of a file are the model's features, in the model's order: by name
    when both the file and the training data had a header, else by position (the label
    column, when the row has one, left out)."""
    features = record["features"]
    if names is not None and record.get("columns"):
        missing = [c for c in record["columns"] if c not in names]
        if missing:
            raise PreprocessingError(f"{path} has no column {missing[0]!r} (the model's "
                                     f"features: {', '.join(record['columns'])})")
        return [names.index(c) for c in record["columns"]]
    if width == features:
        return list(range(width))
    if width == features + 1:
        label = record["label_column"]
        return [i for i in range(width) if i != label]
    raise PreprocessingError(f"{path}: {width} columns; the model takes {features} features "
                             f"(or {features + 1} columns with the label)")


def _numbers(rows: list[list[str]], chosen: list[int], path: Path,
             first_line: int) -> torch.Tensor:
    values = np.empty((len(rows), len(chosen)), dtype=np.float32)
    for number, row in enumerate(rows):
        if len(row) <= max(chosen):
            raise PreprocessingError(f"{path}, row {number + first_line}: {len(row)} columns")
        try:
            values[number] = [float(row[i]) for i in chosen]
        except ValueError:
            raise PreprocessingError(f"{path}, row {number + first_line}: a feature is not "
                                     "a number") from None
    return torch.from_numpy(values)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _labelled_letters(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    features, labels = load_letters(path)
    return torch.from_numpy(features.astype(np.float32)), torch.from_numpy(labels.copy())


def _unlabelled_letters(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, None]:
    return _unlabelled_table({"format": "csv", "header": "no", "columns": None,
                              "features": N_FEATURES, "label_column": N_FEATURES}, path)


def _labelled_images(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    names = record.get("label_names")
    read = read_class_folders(path, record["image_size"], record["channels"],
                              tuple(names) if names else None)
    return torch.from_numpy(read.images), torch.from_numpy(read.labels)


def _unlabelled_images(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, list[str]]:
    files = list_images(path) if path.is_dir() else [path]
    pixels = np.stack([load_scaled(file, record["image_size"], record["channels"])
                       for file in files])
    return torch.from_numpy(pixels), [str(file) for file in files]


def _labelled_mnist(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out part of an MNIST folder (training's validation part); any other
    folder is read as class folders of images."""
    if not (path / mnist.IMAGES_FILE).is_file():
        return _labelled_images(record, path)
    images, labels = mnist.held_out_part(path)
    return mnist.to_model_input(images), torch.from_numpy(labels.astype(np.int64))


def _labelled_arrays(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    arrays = _arrays(path, (record["inputs"], record["targets"]))
    targets = arrays[record["targets"]]
    targets = targets.astype(np.int64) if targets.dtype.kind in "iub" else \
        targets.astype(np.float32)
    return _input_tensor(arrays[record["inputs"]]), torch.from_numpy(targets)


def _unlabelled_arrays(record: dict[str, Any], path: Path) -> tuple[torch.Tensor, None]:
    if path.suffix == ".npy":
        return _input_tensor(np.load(path, allow_pickle=False)), None
    return _input_tensor(_arrays(path, (record["inputs"],))[record["inputs"]]), None


def _arrays(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = read_npz(path, str(path), keep=lambda key: key in keys)
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise PreprocessingError(f"{path} has no array {missing[0]!r}")
    return arrays


def _input_tensor(inputs: np.ndarray) -> torch.Tensor:
    """As training holds arrays: floats and bytes as float32, other integers (tokens) kept."""
    if inputs.dtype.kind == "f" or inputs.dtype == np.uint8:
        inputs = inputs.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(inputs))


_LABELLED: dict[str, Callable[[dict[str, Any], Path], tuple[torch.Tensor, torch.Tensor]]] = {
    "letters": _labelled_letters, "mnist": _labelled_mnist, "csv": _labelled_table,
    "tsv": _labelled_table, "images": _labelled_images, "arrays": _labelled_arrays}
_UNLABELLED: dict[str, Callable[[dict[str, Any], Path], tuple[torch.Tensor, Any]]] = {
    "letters": _unlabelled_letters, "mnist": _unlabelled_images, "csv": _unlabelled_table,
    "tsv": _unlabelled_table, "images": _unlabelled_images, "arrays": _unlabelled_arrays}
