"""Importing the public package is cheap: a plug-in module that only registers a rule or
a codec does not load torch into a process that never trains a torch model."""

from __future__ import annotations

import subprocess
import sys

from devtools.local_cluster import REPO, python_env

PROBE = ("import sys, thrift_trainer as tt; tt.register_aggregation; tt.Codec; "
         "print(tt.__version__, 'torch' in sys.modules)")


def test_importing_thrift_trainer_does_not_import_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    version, torch_loaded = done.stdout.split()
    assert torch_loaded == "False" and version
