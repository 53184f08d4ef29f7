"""What the three commands say when they are started without the trainer's requirements
(outside its virtual environment, say): how to set up, instead of a traceback.

Standard library only: it is imported before anything that needs the requirements.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent
EXIT_FAILURE = 1


@contextlib.contextmanager
def requirements_checked() -> Iterator[None]:
    """Exit 1 with how to set up when the block cannot import a required package; a module
    of the trainer itself that is missing is a bug, and raises as usual."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or _is_ours(exc.name):
            raise
        sys.exit(f"error: Python package '{exc.name.partition('.')[0]}' is missing: this "
                 "command needs the trainer's requirements. Set them up once with "
                 "scripts/setup.sh, then run 'source .venv/bin/activate' (both in "
                 f"{REPO}); or pip install -r requirements.txt in an environment of your own")


def _is_ours(module: str) -> bool:
    """Whether `module` belongs to the trainer's own packages (not its thrift/ IDL folder,
    which Python would otherwise take for the thrift package)."""
    top = REPO / module.partition(".")[0]
    return (top / "__init__.py").exists() or top.with_suffix(".py").exists()
