"""The three commands as functions: the repository's launchers (compute_node.py,
coordinator_node.py, client.py) and the installed console scripts (trainer-node,
trainer-coordinator, trainer-client) both call them.

Standard library only until a command's own modules are imported: a command started
without the trainer's requirements (outside its virtual environment, say) says how to set
up instead of printing a traceback.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages
OUR_PACKAGES = frozenset({"client", "compute_node", "coordinator", "dashboard", "engine",
                          "training", "wire", "thrift_trainer", "trainer_rpc"})
EXIT_FAILURE = 1


def node() -> int:
    """``compute_node.py`` / ``trainer-node``."""
    from thrift_trainer.compute_node.threads import limit_threads, threads_from_argv

    # Before numpy or torch loads (compute_node.cli imports them): they read it only then.
    limit_threads(threads_from_argv(sys.argv[1:]))
    with requirements_checked():
        from thrift_trainer.compute_node.cli import main
    return main()


def coordinator() -> int:
    """``coordinator_node.py`` / ``trainer-coordinator``."""
    with requirements_checked():
        from thrift_trainer.coordinator.cli import main
    return main()


def client() -> int:
    """``client.py`` / ``trainer-client``."""
    with requirements_checked():
        from thrift_trainer.client.cli import main
    return main()


@contextlib.contextmanager
def requirements_checked() -> Iterator[None]:
    """Exit 1 with how to set up when the block cannot import a required package; a module
    of the trainer itself that is missing is a bug, and raises as usual."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in OUR_PACKAGES:
            raise
        sys.exit(f"error: Python package '{exc.name.partition('.')[0]}' is missing: this "
                 f"command needs the trainer's requirements. {_how_to_set_up()}")


def _how_to_set_up() -> str:
    if (ROOT / "scripts" / "setup.sh").exists():  # a checkout
        return ("Set them up once with scripts/setup.sh, then run 'source .venv/bin/activate' "
                f"(both in {ROOT}); or pip install {ROOT} in an environment of your own")
    return "Install them with: pip install thrift-trainer"
