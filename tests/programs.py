"""Programs outside Python that some tests need: the Thrift compiler, Node.js with npm,
Chromium with its driver. Without one, such a test skips on a developer's machine but
fails under CI (the CI variable set, as .ci/run sets it), so CI cannot pass without it."""

from __future__ import annotations

import os
import shutil

import pytest


def missing_commands(*names: str) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


def require(missing: list[str], install: str) -> None:
    """Skip the test, or fail it under CI, when `missing` names anything; `install` says
    how to get what is missing."""
    if not missing:
        return
    reason = f"needs {', '.join(missing)} ({install})"
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason}; under CI no test skips for a missing program", pytrace=False)
    pytest.skip(reason)
