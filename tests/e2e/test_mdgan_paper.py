"""bench/mdgan_paper.py --quick through real processes: results, skipping, report, bytes.

The quick grid runs the standalone GAN, FL-GAN, MD-GAN and MD-GAN with a crash on tiny
models with 2 nodes; the test checks what each configuration stored, that a second
invocation skips them all, and that MD-GAN's bytes on the wire, counted at the
transport, are within 5 % of the MD-GAN paper's Table III.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import mdgan_paper  # noqa: E402

pytestmark = pytest.mark.slow
TOLERANCE = 0.05


def run_quick(tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    """The command, ended by SIGTERM past ``timeout`` (it then stops its own nodes and
    coordinator, which a SIGKILL would leave running)."""
    command = [sys.executable, str(REPO / "bench" / "mdgan_paper.py"), "--quick",
               "--out", str(tmp_path / "results"), "--page", str(tmp_path / "page.md")]
    with subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env=mdgan_paper.local_cluster.python_env()) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"--quick took over {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("mdgan-quick")
    done = run_quick(tmp, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return tmp, done


def stored(tmp: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (tmp / "results").glob("*.json")}


def test_every_configuration_stores_finite_scores_up_to_its_last_iteration(quick) -> None:
    tmp, _ = quick
    results = stored(tmp)
    members = mdgan_paper.quick_members(mdgan_paper.settings_from(
        mdgan_paper.parse_args(["--quick"])))
    assert sorted(results) == sorted(e.key for e in members)
    for exp in members:
        curve = results[exp.key]["curve"]
        assert curve, exp.key
        assert curve[-1]["iteration"] >= exp.iterations * 0.5, exp.key
        for row in curve:
            assert all(math.isfinite(row[m]) for m in mdgan_paper.METRICS), (exp.key, row)
            # IS lies between 1 and the classifier's 10 classes
            assert 1.0 - 1e-9 <= row["inception_score"] <= 10.0 + 1e-9, (exp.key, row)


def test_the_crash_run_lost_a_node_and_still_finished(quick) -> None:
    tmp, _ = quick
    crash = stored(tmp)["quick-n2-mdgan-k1-crash"]
    assert len(crash["crashes"]) == 1
    assert crash["crashes"][0]["after_round"] >= 3  # I / N = 6 / 2


def test_the_page_has_the_tables_and_the_curves(quick) -> None:
    tmp, _ = quick
    page = (tmp / "page.md").read_text()
    assert mdgan_paper.BEGIN in page and mdgan_paper.END in page
    assert "| MD-GAN N=2 k=1 |" in page and "| FL-GAN N=2 |" in page
    assert "Bytes on the wire" in page
    assert (tmp / "images" / "mdgan_quick.png").stat().st_size > 1000


def test_mdgan_bytes_on_the_wire_match_table_iii(quick) -> None:
    tmp, _ = quick
    exp = next(e for e in mdgan_paper.quick_members(mdgan_paper.settings_from(
        mdgan_paper.parse_args(["--quick"]))) if e.key == "quick-n2-mdgan-k1")
    got = mdgan_paper.measured_bytes(exp, stored(tmp)[exp.key]["wire"])
    want = mdgan_paper.formula_bytes(exp)
    assert got["calls"] >= exp.iterations * exp.workers
    assert got["down"] == pytest.approx(want["down"], rel=TOLERANCE)  # 2bd
    assert got["up"] == pytest.approx(want["up"], rel=TOLERANCE)  # bd
    assert got["swaps"] > 0
    assert want["adam"] == 0 and got["swap"] == pytest.approx(want["theta"], rel=TOLERANCE)


def test_swaps_with_adam_state_carry_theta_plus_the_moments(quick) -> None:
    tmp, _ = quick
    exp = next(e for e in mdgan_paper.quick_members(mdgan_paper.settings_from(
        mdgan_paper.parse_args(["--quick"]))) if e.key == "quick-n2-mdgan-k1-crash")
    got = mdgan_paper.measured_bytes(exp, stored(tmp)[exp.key]["wire"])
    want = mdgan_paper.formula_bytes(exp)
    assert got["swaps"] > 0 and want["adam"] > want["theta"]
    assert got["swap"] == pytest.approx(want["theta"] + want["adam"], rel=TOLERANCE)


def test_a_second_run_skips_every_finished_configuration(quick) -> None:
    tmp, _ = quick
    before = {k: v["seconds"] for k, v in stored(tmp).items()}
    again = run_quick(tmp, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "running" not in again.stderr
    assert {k: v["seconds"] for k, v in stored(tmp).items()} == before
