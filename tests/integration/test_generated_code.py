"""gen-py/ is exactly what scripts/gen_thrift.sh makes from thrift/ (never hand-edited), and
the IDL's namespaces place the code of the other languages' generators."""

from __future__ import annotations

import filecmp
import os
import subprocess

import pytest

from devtools.local_cluster import REPO
from tests.programs import missing_commands, require


def _differences(left, right) -> list[str]:
    cmp = filecmp.dircmp(left, right, ignore=["__pycache__"])
    found = [f"only in {left}: {n}" for n in cmp.left_only]
    found += [f"only in {right}: {n}" for n in cmp.right_only]
    found += [f"differs: {n}" for n in cmp.diff_files]
    for sub in cmp.common_dirs:
        found += _differences(os.path.join(left, sub), os.path.join(right, sub))
    return found


def _need_compiler() -> None:
    require(missing_commands("thrift"), "apt-get install thrift-compiler")


def test_committed_gen_py_matches_a_fresh_generation(tmp_path):
    _need_compiler()
    out = tmp_path / "gen-py"
    subprocess.run([str(REPO / "scripts" / "gen_thrift.sh"), str(out)], check=True, timeout=60)
    assert _differences(REPO / "gen-py", out) == []


@pytest.mark.parametrize("generator, made", [
    ("java", "trainer/rpc/Coordinator.java"),  # namespace java trainer.rpc
    ("go", "trainerrpc/trainer.go"),  # namespace go trainerrpc
    ("js:node", "Coordinator.js"),
])
def test_other_languages_generate_under_the_idl_namespaces(tmp_path, generator, made):
    _need_compiler()
    subprocess.run(["thrift", "--gen", generator, "-out", str(tmp_path),
                    str(REPO / "thrift" / "trainer.thrift")], check=True, timeout=60)
    assert (tmp_path / made).is_file()
