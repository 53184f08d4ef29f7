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
* images (and MNIST): ``mean`` / ``std``, per-channel statistics the pixels are normalised
  by, ``(x - mean) / std``, in both parts (kept in the model file);
  ``augment`` (``none`` | ``flip`` | ``crop`` | ``crop_flip``: random horizontal flips and
  crops after ``crop_padding`` pixels of zeros on each side) of the training batches on the
  nodes, seeded by (run seed, round, unit); ``transform``, a plug-in
  ``module:function(inputs, targets, generator)`` returning ``(inputs, targets)``, applied
  to every training batch after ``augment``.
* ``prefetch``: training batches a node reads (and augments) ahead in a thread while it
  computes (0: none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from thrift_trainer.training.config_types import checked_value
from thrift_trainer.training.settings_section import SettingsSection

SECTION = "data"
FORMATS = ("auto", "letters", "mnist", "csv", "tsv", "images", "arrays")
HEADERS = ("auto", "yes", "no")
AUGMENTS = ("none", "flip", "crop", "crop_flip")
# how training batches are shaped on the nodes: they change no example that is read, so
# they stay out of the data set's fingerprint while they are at their defaults
LOOP_KEYS = ("augment", "crop_padding", "transform", "prefetch")


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
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    augment: str = "none"
    crop_padding: int = 4
    transform: str = ""
    prefetch: int = 0

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
        self._check_loop()

    def _check_loop(self) -> None:
        for key in ("mean", "std"):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and
                       math.isfinite(v) for v in getattr(self, key)):
                raise DataSettingsError(f"{SECTION}.{key} must be a list of numbers, "
                                        f"got {getattr(self, key)!r}")
        if len(self.mean) != len(self.std):
            raise DataSettingsError(f"{SECTION}.mean and {SECTION}.std must give one value "
                                    f"per channel each, got {len(self.mean)} and "
                                    f"{len(self.std)}")
        if any(not value > 0 for value in self.std):
            raise DataSettingsError(f"{SECTION}.std must be positive, got {self.std}")
        if self.mean and self.normalize:
            raise DataSettingsError(f"{SECTION}.normalize computes the statistics and "
                                    f"{SECTION}.mean / std give them: set one of the two")
        if self.augment not in AUGMENTS:
            raise DataSettingsError(f"{SECTION}.augment must be one of {', '.join(AUGMENTS)}, "
                                    f"got {self.augment!r}")
        if not 0 <= self.crop_padding <= 64:
            raise DataSettingsError(f"{SECTION}.crop_padding must be in 0..64, "
                                    f"got {self.crop_padding}")
        if self.transform and ":" not in self.transform:
            raise DataSettingsError(f"{SECTION}.transform must be a plug-in "
                                    f"module:function, got {self.transform!r}")
        if not 0 <= self.prefetch <= 64:
            raise DataSettingsError(f"{SECTION}.prefetch must be in 0..64, "
                                    f"got {self.prefetch}")

    def hashed(self) -> dict[str, Any]:
        """What the data set's fingerprint (and a process's cache of it) covers: every
        key but the batch shaping ones (`LOOP_KEYS`), which change no example read, and
        the given statistics only when given, so that a data set's fingerprint is what it
        was before they existed."""
        return {key: value for key, value in self.to_dict().items()
                if key not in LOOP_KEYS and (key not in ("mean", "std") or value)}

    def loop_changes(self) -> dict[str, Any]:
        """The batch shaping keys a run changes (for the model file's description)."""
        return {key: value for key, value in self.changed().items() if key in LOOP_KEYS}


def _typed(key: str, value: Any, default: Any) -> Any:
    return checked_value(f"{SECTION}.{key}", value, default, DataSettingsError)
