"""What the typed sections of a run spec share (training/spec.py): their values as a dict,
and the keys that differ from their defaults, which is what a request needs to carry."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


class SettingsSection:
    """Mixed into a frozen dataclass whose fields all have defaults."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def changed(self) -> dict[str, Any]:
        """The keys that differ from their defaults."""
        defaults = asdict(type(self)())  # type: ignore[call-overload]
        return {k: v for k, v in self.to_dict().items() if defaults[k] != v}
