"""What a new user meets first: a command started outside its environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.local_cluster import REPO, python_env

ANSWER_SECONDS = 60.0


@pytest.mark.parametrize("script", ["client.py", "compute_node.py", "coordinator_node.py"])
def test_a_command_without_its_requirements_says_how_to_set_up(script, tmp_path):
    """-S leaves out site-packages: the interpreter a user gets without the virtual
    environment, where rich, thrift, numpy... are missing."""
    done = subprocess.run([sys.executable, "-S", str(REPO / script), "--help"], cwd=tmp_path,
                          env=python_env(), capture_output=True, text=True,
                          timeout=ANSWER_SECONDS)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "scripts/setup.sh" in done.stderr and "source .venv/bin/activate" in done.stderr

