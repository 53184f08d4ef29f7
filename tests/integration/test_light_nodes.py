"""Light nodes matter: dozens of them fit on one machine only without torch. Each check
runs in a fresh interpreter, since this one has loaded torch for other tests."""

from __future__ import annotations

import subprocess
import sys

from devtools.local_cluster import REPO


def torch_loaded_after(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", f"import sys; {code}; "
                           "print('torch' in sys.modules)"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_letters_work_never_loads_torch() -> None:
    assert torch_loaded_after("import tests.unit.test_node_handler as t; "
                              "t.handler().train_with_weights(t.request())") == "False"


def test_the_node_command_starts_without_torch() -> None:
    # A node loads torch for a torch model's unit or its local workers, not to start.
    assert torch_loaded_after("import thrift_trainer.compute_node.cli") == "False"
