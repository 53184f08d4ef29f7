"""Fixtures of the unit tests: plug-in modules written to a temporary folder."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from thrift_trainer.training import plugins


@pytest.fixture
def plugin_module(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``write(name, source)``: the module ``name`` in a temporary folder, which `allow`
    (with that folder, as ``--plugin-dir``) can then allow. Afterwards the process allows
    nothing again and forgets the modules and the folder."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    path_before = list(sys.path)

    def write(name: str, source: str) -> Path:
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        importlib.invalidate_caches()  # the import system caches folder listings
        return folder

    plugins.reset()
    try:
        yield write
    finally:
        plugins.reset()
        sys.path[:] = path_before
        for name, module in list(sys.modules.items()):
            if str(folder) in str(getattr(module, "__file__", None) or ""):
                del sys.modules[name]
