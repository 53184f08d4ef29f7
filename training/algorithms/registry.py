"""Algorithm names to classes: the built-in ones registered by "module:Class", plug-ins
resolved through training/plugins.py."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms.base import Algorithm
from thrift_trainer.training.algorithms.config_checks import ConfigError


@dataclass
class Registry:
    """Names to algorithm classes, checked at the boundary with a helpful message.

    Entries are "module:Class" strings imported on first use, so a process only loads
    what its runs need (the letters MLP never imports torch).
    """

    entries: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, target: str) -> None:
        self.entries[name] = target

    def get(self, name: str) -> type[Algorithm]:
        """The class of a built-in name, or of a plug-in ``module:Class`` (imported only from
        a module this process allows, training/plugins.py)."""
        if plugins.is_plugin_name(name) and name not in self.entries:
            found = plugins.resolve(name, "algorithm")
            if not (isinstance(found, type) and issubclass(found, Algorithm)):
                raise plugins.PluginError(f"algorithm {name} is not a subclass of "
                                          "thrift_trainer.Algorithm")
            return found
        try:
            target = self.entries[name]
        except KeyError:
            known = ", ".join(sorted(self.entries))
            raise ConfigError(f"unknown algorithm {name!r}; known: {known}, or a plug-in "
                              f"module:Class") from None
        module, _, cls = target.partition(":")
        return getattr(importlib.import_module(module), cls)
