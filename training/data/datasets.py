"""Data sets of torch models: built-in formats that need no code, and plug-ins.

`load_data` reads ``run.dataset`` under a process's data root with the run's ``data``
settings (training/data/settings.py) into a training part and a validation part, each read
by example index: a work unit is an index range of the training part, and every node reads
its own copy. Built-in formats (letters, MNIST, CSV/TSV tables, class folders of images,
.npz/.npy arrays) are held in memory as tensors; a plug-in (``my_data:make_dataset``)
returns a map-style data set (``__len__``, ``__getitem__`` giving ``(input, target)``),
read item by item and stacked with torch's default collate.

`LoadedData.fingerprint` hashes what was read (the files' bytes, or a plug-in's own
``fingerprint()`` or a few of its items), so nodes whose copies differ are told apart.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import default_collate

from thrift_trainer.training import plugins
from thrift_trainer.training.data import client_sets, mnist, preprocessing
from thrift_trainer.training.data.image_classes import read_class_folders
from thrift_trainer.training.data.letters import load_letters
from thrift_trainer.training.data.paths import DataPathError, folder_stamp, resolve_under
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.data.tables import read_tables
from thrift_trainer.training.models.settings import DataShape
from thrift_trainer.training.outputs.checked_npz import read_npz
from thrift_trainer.training.plugins import PluginError

SPLIT_SEED = 0  # the held-out choice of validation_fraction, the same on every node
SAMPLED_ITEMS = 3  # items of a plug-in data set hashed when it has no fingerprint()


class DataError(ValueError):
    """A data set that cannot be read as configured; the message names it and why."""


class Split(Protocol):
    """One part of a data set, read by example index."""

    def __len__(self) -> int: ...

    def take(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of these examples, stacked along a first batch dimension."""


@dataclass(frozen=True)
class TensorSplit:
    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)

    def take(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return self.inputs[index], self.targets[index]


@dataclass(frozen=True)
class PluginSplit:
    source: Any  # a map-style data set
    indices: np.ndarray  # its items that belong to this part

    def __len__(self) -> int:
        return len(self.indices)

    def take(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.source[int(self.indices[i])] for i in indices]
        inputs, targets = default_collate(items)
        return torch.as_tensor(inputs), torch.as_tensor(targets)


@dataclass(frozen=True)
class LoadedData:
    train: Split
    validation: Split
    shape: DataShape
    fingerprint: str
    description: str  # one line for logs, e.g. "csv: 18,000 + 2,000 examples, 26 classes"
    # How examples were read and preprocessed (training/data/preprocessing.py): a model
    # file records it, so `client.py evaluate` and `predict` read new data the same way.
    record: dict[str, Any] = field(default_factory=dict)
    # A plug-in that returned several named clients (training/data/client_sets.py): each
    # one's positions in the two parts; empty: the data set is one client.
    clients: dict[str, client_sets.ClientParts] = field(default_factory=dict)


def load_data(dataset: str, location: Path, settings: DataSettings) -> LoadedData:
    """The data set, read once per process and settings (a node serves many units).
    ``location``: the data set's folder (training/data/paths.py's `data_location`), or the
    data root for a plug-in data set. DataError (or PluginError for a plug-in) names what
    cannot be read."""
    return _load_cached(dataset, str(Path(location).resolve()),
                        json.dumps(settings.hashed(), sort_keys=True), folder_stamp(location))


@functools.lru_cache(maxsize=4)
def _load_cached(dataset: str, location: str, settings_json: str,
                 stamp: tuple) -> LoadedData:
    settings = DataSettings.from_mapping(json.loads(settings_json))
    if plugins.is_plugin_name(dataset):
        return _plugin_data(dataset, Path(location), settings)
    folder = Path(location)
    try:
        kind = settings.format if settings.format != "auto" else _detect(folder)
        train, validation, files, classes, record = _READERS[kind](folder, settings)
    except (DataPathError, OSError, ValueError) as exc:
        raise DataError(f"data set {dataset}: {exc}") from None
    if settings.normalize:
        train, validation, statistics = _normalized(train, validation)
        record = {**record, **statistics}
    if settings.mean:
        train, validation, statistics = _channel_normalized(dataset, train, validation,
                                                            settings)
        record = {**record, **statistics}
    return _loaded(kind, train, validation, _files_hash(folder, files, settings), classes,
                   record)


# ------------------------------------------------------------------ built-in formats
# training part, validation part, the files read, the number of classes (None: count
# them from the targets), the record of how examples were read
Parts = tuple[TensorSplit, TensorSplit, list[Path], int | None, dict[str, Any]]


def _detect(folder: Path) -> str:
    names = [p.name for p in folder.iterdir()]
    if mnist.IMAGES_FILE in names:
        return "mnist"
    if any(n.startswith("train_") for n in names) and any(n.startswith("validate_")
                                                           for n in names):
        return "letters"
    for suffix, kind in ((".csv", "csv"), (".tsv", "tsv"), (".npz", "arrays"),
                         (".npy", "arrays")):
        if any(n.endswith(suffix) for n in names):
            return kind
    if any(p.is_dir() for p in folder.iterdir()):
        return "images"
    raise DataError(f"cannot tell the format of {folder}: set data.format to one of "
                    "letters, mnist, csv, tsv, images, arrays")


def _letters(folder: Path, settings: DataSettings) -> Parts:
    train_files = _files(folder, settings.train or "train_*")
    validation_files = _files(folder, settings.validation or "validate_*")
    train = [load_letters(p) for p in train_files]
    validation = [load_letters(p) for p in validation_files]
    return (_tensors(np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
            _tensors(np.concatenate([x for x, _ in validation]),
                     np.concatenate([y for _, y in validation])),
            train_files + validation_files, None, preprocessing.letters_record())


def _mnist(folder: Path, settings: DataSettings) -> Parts:
    images, labels = mnist.training_part(folder)
    held_images, held_labels = mnist.held_out_part(folder)
    return (TensorSplit(mnist.to_model_input(images), torch.from_numpy(labels.copy())),
            TensorSplit(mnist.to_model_input(held_images), torch.from_numpy(held_labels.copy())),
            [folder / mnist.IMAGES_FILE, folder / mnist.LABELS_FILE], None,
            preprocessing.mnist_record())


def _table(delimiter: str) -> Callable[[Path, DataSettings], Parts]:
    suffix = ".csv" if delimiter == "," else ".tsv"

    def read(folder: Path, settings: DataSettings) -> Parts:
        validation_files = _files(folder, settings.validation) if settings.validation else []
        train_files = [p for p in _files(folder, settings.train or f"*{suffix}")
                       if p not in validation_files]
        train = read_tables(train_files, delimiter, settings.label, settings.header)
        if validation_files:
            held = read_tables(validation_files, delimiter, settings.label, settings.header,
                               train.classes)
            parts = (_tensors(train.features, train.labels), _tensors(held.features, held.labels))
        else:
            parts = _fraction(_tensors(train.features, train.labels),
                              settings.validation_fraction)
        classes = len(train.classes) if train.classes else None
        return (*parts, train_files + validation_files, classes,
                preprocessing.table_record(suffix[1:], settings, train))
    return read


def _images(folder: Path, settings: DataSettings) -> Parts:
    train_folder = resolve_under(folder, settings.train) if settings.train else \
        (folder / "train" if (folder / "train").is_dir() else folder)
    held_name = settings.validation or next(
        (n for n in ("validation", "val") if (folder / n).is_dir()), "")
    train = read_class_folders(train_folder, settings.image_size, settings.channels)
    train_split = _tensors(train.images, train.labels)
    if held_name:
        held = read_class_folders(resolve_under(folder, held_name), settings.image_size,
                                  settings.channels, train.classes)
        parts = (train_split, _tensors(held.images, held.labels))
        files = list(train.files + held.files)
    else:
        parts, files = _fraction(train_split, settings.validation_fraction), list(train.files)
    return *parts, files, len(train.classes), preprocessing.image_record(settings,
                                                                         train.classes)


def _arrays(folder: Path, settings: DataSettings) -> Parts:
    train_name = settings.train or _only(folder, ("train.npz",), "*.npz")
    train, train_files = _read_arrays(folder, train_name, settings)
    held_name = settings.validation or ("validation.npz" if (folder / "validation.npz")
                                        .is_file() else "")
    if held_name:
        held, held_files = _read_arrays(folder, held_name, settings)
        return train, held, train_files + held_files, None, \
            preprocessing.arrays_record(settings)
    return (*_fraction(train, settings.validation_fraction), train_files, None,
            preprocessing.arrays_record(settings))


def _read_arrays(folder: Path, name: str, settings: DataSettings
                 ) -> tuple[TensorSplit, list[Path]]:
    """An .npz file (keys ``inputs`` and ``targets``) or ``inputs.npy,targets.npy``."""
    names = [n.strip() for n in name.split(",")]
    if len(names) == 2:
        paths = [resolve_under(folder, n) for n in names]
        inputs, targets = (np.load(p, allow_pickle=False) for p in paths)
        return _tensors(inputs, targets), paths
    path = resolve_under(folder, name)
    wanted = (settings.inputs, settings.targets)
    arrays = read_npz(path, str(path), keep=lambda key: key in wanted)
    missing = [k for k in wanted if k not in arrays]
    if missing:
        with zipfile.ZipFile(path) as archive:
            held = ", ".join(n.removesuffix(".npy") for n in archive.namelist())
        raise DataError(f"{path} has no array {missing[0]!r} (data.inputs / data.targets; "
                        f"it holds {held})")
    return _tensors(arrays[settings.inputs], arrays[settings.targets]), [path]


_READERS: dict[str, Callable[[Path, DataSettings], Parts]] = {
    "letters": _letters, "mnist": _mnist, "csv": _table(","), "tsv": _table("\t"),
    "images": _images, "arrays": _arrays}


def _files(folder: Path, pattern: str) -> list[Path]:
    """The files a glob names under ``folder``, in natural order (file2 before file10)."""
    resolve_under(folder, *Path(pattern).parts)  # refuses a pattern that leaves the folder
    found = sorted((p for p in folder.glob(pattern) if p.is_file()),
                   key=lambda p: [int(s) if s.isdigit() else s
                                  for s in re.split(r"(\d+)", p.name)])
    if not found:
        raise DataError(f"no file matches {pattern!r} in {folder}")
    return found


def _only(folder: Path, preferred: Sequence[str], pattern: str) -> str:
    for name in preferred:
        if (folder / name).is_file():
            return name
    found = sorted(p.name for p in folder.glob(pattern))
    if len(found) != 1:
        raise DataError(f"set data.train: {folder} holds {len(found)} files {pattern}")
    return found[0]


def _tensors(inputs: np.ndarray, targets: np.ndarray) -> TensorSplit:
    if len(inputs) != len(targets):
        raise DataError(f"{len(inputs)} inputs but {len(targets)} targets")
    inputs = np.asarray(inputs)
    inputs = inputs.astype(np.float32) if inputs.dtype.kind == "f" or inputs.dtype == np.uint8 \
        else inputs
    targets = np.asarray(targets)
    targets = targets.astype(np.int64) if targets.dtype.kind in "iub" else \
        targets.astype(np.float32)
    return TensorSplit(torch.from_numpy(np.ascontiguousarray(inputs)),
                       torch.from_numpy(np.ascontiguousarray(targets)))


def _fraction(split: TensorSplit, fraction: float) -> tuple[TensorSplit, TensorSplit]:
    train, held = held_out(len(split), fraction)
    return split_at(split, train), split_at(split, held)


def held_out(size: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and validation parts when ``fraction`` is held out: a
    fixed choice (the same on every node), each part in the data set's order."""
    count = round(size * fraction)
    if fraction and (count < 1 or count >= size):
        raise DataError(f"data.validation_fraction {fraction} of {size} examples leaves a "
                        "part empty")
    chosen = np.random.default_rng(SPLIT_SEED).permutation(size)[:count]
    mask = np.zeros(size, dtype=bool)
    mask[chosen] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def split_at(split: TensorSplit, indices: np.ndarray) -> TensorSplit:
    return TensorSplit(*split.take(indices))


def _normalized(train: TensorSplit, validation: TensorSplit
                ) -> tuple[TensorSplit, TensorSplit, dict[str, Any]]:
    """Each feature standardised by the training part's mean and deviation; the
    statistics as the record keeps them."""
    mean = train.inputs.mean(dim=0)
    std = train.inputs.std(dim=0).clamp_min(1e-6)
    return (TensorSplit((train.inputs - mean) / std, train.targets),
            TensorSplit((validation.inputs - mean) / std, validation.targets),
            preprocessing.normalization_record(mean, std))


def _channel_normalized(dataset: str, train: TensorSplit, validation: TensorSplit,
                        settings: DataSettings
                        ) -> tuple[TensorSplit, TensorSplit, dict[str, Any]]:
    """Images normalised by the given per-channel statistics (data.mean, data.std)."""
    channels = train.inputs.shape[1] if train.inputs.dim() == 4 else None
    if channels != len(settings.mean):
        what = f"{channels} channels" if channels else \
            f"examples of shape {tuple(train.inputs.shape[1:])}, not images"
        raise DataError(f"data set {dataset}: data.mean and data.std give "
                        f"{len(settings.mean)} per-channel values; it holds {what}")
    record = preprocessing.channel_normalization_record(settings.mean, settings.std)
    return (TensorSplit(preprocessing.normalized(train.inputs, record), train.targets),
            TensorSplit(preprocessing.normalized(validation.inputs, record),
                        validation.targets), record)


def _files_hash(folder: Path, files: list[Path], settings: DataSettings) -> str:
    digest = hashlib.sha256(json.dumps(settings.hashed(), sort_keys=True).encode())
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _loaded(kind: str, train: Split, validation: Split, fingerprint: str,
            classes: int | None, record: dict[str, Any]) -> LoadedData:
    if len(train) == 0:
        raise DataError(f"{kind}: the training part is empty")
    inputs, targets = train.take(np.arange(1))
    integer = not torch.is_floating_point(targets)
    num_classes = classes or (_count_classes(train, validation) if integer else None)
    shape = DataShape(tuple(inputs.shape[1:]), num_classes)
    what = f"{num_classes} classes" if num_classes else "real targets"
    return LoadedData(train, validation, shape, fingerprint,
                      f"{kind}: {len(train):,} + {len(validation):,} examples of shape "
                      f"{tuple(inputs.shape[1:])}, {what}", record)


def _count_classes(*splits: Split) -> int:
    """The largest class number + 1, from the targets (tensor splits) or a scan."""
    top = 0
    for split in splits:
        if len(split) == 0:
            continue
        targets = split.targets if isinstance(split, TensorSplit) else \
            split.take(np.arange(len(split)))[1]
        top = max(top, int(targets.max()) + 1)
    return top


# ------------------------------------------------------------------ plug-ins
def _plugin_data(name: str, data_root: Path, settings: DataSettings) -> LoadedData:
    factory = plugins.resolve(name, "data set")
    takes_split = _takes(factory, "split")
    made = {split: _make(name, factory, data_root, settings, split)
            for split in (("train", "validation") if takes_split else ("all",))}
    named = {split: client_sets.check_mapping(name, split, data) for split, data in made.items()}
    if takes_split:
        client_sets.check_same_clients(name, named["train"], named["validation"])
    if named[next(iter(made))] is not None:
        return _named_clients_data(name, named, settings)
    if takes_split:
        train = PluginSplit(made["train"], np.arange(len(made["train"])))
        validation = PluginSplit(made["validation"], np.arange(len(made["validation"])))
    else:
        source = made["all"]
        train_idx, held_idx = held_out(len(source), settings.validation_fraction)
        train, validation = PluginSplit(source, train_idx), PluginSplit(source, held_idx)
    classes = getattr(next(iter(made.values())), "num_classes", None)
    return _plugin_loaded(name, train, validation, _plugin_hash(made, settings), classes)


def _plugin_loaded(name: str, train: Split, validation: Split, fingerprint: str,
                   classes: int | None,
                   clients: dict[str, client_sets.ClientParts] | None = None) -> LoadedData:
    try:
        loaded = _loaded(name, train, validation, fingerprint, classes,
                         preprocessing.plugin_record(name))
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError) as exc:
        raise PluginError(f"data set {name}: its items cannot be read as (input, target) "
                          f"pairs: {type(exc).__name__}: {exc}") from None
    return replace(loaded, clients=clients or {})


def _named_clients_data(name: str, named: dict[str, dict[str, Any] | None],
                        settings: DataSettings) -> LoadedData:
    """A plug-in's several named clients as one training and one validation part (their
    data sets in name order, each client a range of positions)."""
    parts = client_sets.combined(named, settings.validation_fraction, SPLIT_SEED)
    clients = {key: client_sets.ClientParts(parts.train_positions[key],
                                            parts.validation_positions[key],
                                            _plugin_hash(made, settings))
               for key, made in parts.own.items()}
    fingerprint = _plugin_hash({f"{key}/{split}": data for key, made in parts.own.items()
                                for split, data in made.items()}, settings)
    first = next(iter(parts.own.values()))
    return _plugin_loaded(name, PluginSplit(*parts.train), PluginSplit(*parts.validation),
                          fingerprint, getattr(next(iter(first.values())), "num_classes", None),
                          clients)


def _make(name: str, factory: Callable[..., Any], data_root: Path, settings: DataSettings,
          split: str) -> Any:
    kwargs = dict(settings.args)
    if _takes(factory, "root"):
        kwargs["root"] = data_root
    if split != "all":
        kwargs["split"] = split
    try:
        data = factory(**kwargs)
    except Exception as exc:
        raise PluginError(f"data set {name} could not be made: {type(exc).__name__}: "
                          f"{exc}") from None
    if not client_sets.is_map_style(data):
        raise PluginError(f"data set {name} is not a map-style data set (it needs __len__ "
                          f"and __getitem__; it gave a {type(data).__name__})")
    return data


def _takes(factory: Callable[..., Any], parameter: str) -> bool:
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _plugin_hash(made: dict[str, Any], settings: DataSettings) -> str:
    digest = hashlib.sha256(json.dumps(settings.hashed(), sort_keys=True, default=str)
                            .encode())
    for split, data in made.items():
        digest.update(f"{split}:{len(data)}".encode())
        own = getattr(data, "fingerprint", None)
        if callable(own):
            digest.update(str(own()).encode())
            continue
        size = len(data)
        for index in sorted({0, size // 2, size - 1} if size else set())[:SAMPLED_ITEMS]:
            for part in default_collate([data[index]]):
                digest.update(torch.as_tensor(part).numpy().tobytes())
    return digest.hexdigest()[:16]
