"""How a data set is read: the ``data`` section of a run's configuration, checked.

Used by torch models (training/models/modules.py); the letters MLP and the GANs read
their data sets their own way and ignore it. Without torch, so the client and the spec
(training/spec.py) can check it.

* ``format``: ``auto`` (from what the folder holds) | ``letters`` (the letters shards as a
  table) | ``mnist`` (the shipped MNIST images with their labels) | ``csv`` | ``tsv`` |
  ``images`` (one subfolder per class) | ``arrays`` (.npz, or .npy pairs).
* ``train`` / ``validation``: files (a glob for tables), a folder (images) or
  ``inputs.npy,targets.npy`` (arrays) under the data set folder; empty: the format's
  default. Without a validation part, ``validation_fraction`` of the training examples
  (a fixed choice, the same on every node) is held out.
* tables: ``label`` (a header's column name, a 0-based index, ``first`` or ``last``),
  ``header`` (``auto`` | ``yes`` | ``no``), ``normalize`` (standardise each feature by the
  training part's mean and deviation).
* images: ``image_size`` (resized, centre-cropped square) and ``channels`` (1 grey, 3 RGB).
* arrays: ``inputs`` and ``targets``, the keys of an .npz file.
* ``args``: keyword arguments of a plug-in data set's factory (``run.dataset:
  my_data:make_dataset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from thrift_trainer.training.settings_section import SettingsSection

SECTION = "data"
FORMATS = ("auto", "letters", "mnist", "csv", "tsv", "images", "arrays")
HEADERS = ("auto", "yes", "no")


class DataSettingsError(ValueError):
    """A ``data`` setting that cannot be used; the message names the key."""


@dataclass(frozen=True)
class DataSettings(SettingsSection):
    format: str = "auto"
    train: str = ""
    validation: str = ""
    validation_fraction: float = 0.1
    label: str = "last"
    header: str = "auto"
    normalize: bool = False
    image_size: int = 28
    channels: int = 1
    inputs: str = "x"
    targets: str = "y"
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, raw: Any) -> DataSettings:
        """Checked settings; DataSettingsError names the first bad key."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise DataSettingsError(f"{SECTION} must be a mapping, got {raw!r}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise DataSettingsError(f"unknown key '{SECTION}.{unknown[0]}'; known: "
                                    f"{', '.join(known)}")
        defaults = asdict(cls())
        values = {key: _typed(key, raw[key], defaults[key]) for key in raw}
        settings = cls(**values)
        settings._check()
        return settings

    def _check(self) -> None:
        if self.format not in FORMATS:
            raise DataSettingsError(f"{SECTION}.format must be one of {', '.join(FORMATS)}, "
                                    f"got {self.format!r}")
        if self.header not in HEADERS:
            raise DataSettingsError(f"{SECTION}.header must be one of {', '.join(HEADERS)}, "
                                    f"got {self.header!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise DataSettingsError(f"{SECTION}.validation_fraction must be in [0, 1), "
                                    f"got {self.validation_fraction}")
        if not 1 <= self.image_size <= 4096:
            raise DataSettingsError(f"{SECTION}.image_size must be in 1..4096, "
                                    f"got {self.image_size}")
        if self.channels not in (1, 3):
            raise DataSettingsError(f"{SECTION}.channels must be 1 or 3, got {self.channels}")


def _typed(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, dict):
        ok = isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
        value = dict(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        kind = {bool: "a boolean", float: "a number", int: "an integer", dict: "a mapping",
                str: "a string"}[type(default)]
        raise DataSettingsError(f"{SECTION}.{key} must be {kind}, got {value!r}")
    return value
