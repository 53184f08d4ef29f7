"""The demo keeps what its run wrote, in a folder of its own under the repository."""

from __future__ import annotations

import importlib.util
import subprocess

from devtools.local_cluster import REPO

spec = importlib.util.spec_from_file_location("demo", REPO / "scripts" / "demo.py")
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)


def test_each_demo_gets_a_new_folder_that_git_ignores(tmp_path):
    first = demo.demo_folder(tmp_path, now=0.0)
    second = demo.demo_folder(tmp_path, now=0.0)  # a second demo within the same second
    assert first.is_dir() and second.is_dir() and first != second
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{demo.DEMO_ROOT}/x/runs/r/a.png"],
                             cwd=REPO)
    assert ignored.returncode == 0


def test_the_demo_says_where_the_run_folder_and_curves_are(tmp_path):
    assert "no run folder" in demo.where_outputs_are(tmp_path)[0]
    run_dir = tmp_path / "runs" / "abc123"
    run_dir.mkdir(parents=True)
    assert demo.where_outputs_are(tmp_path) == [
        f"run folder (kept): {run_dir}", "curves: not written (the run did not finish)"]
    (run_dir / "curves.png").write_bytes(b"png")
    assert demo.where_outputs_are(tmp_path)[1] == f"curves: {run_dir / 'curves.png'}"
