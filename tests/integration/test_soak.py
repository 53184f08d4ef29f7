"""The soak benchmark in quick mode: node processes SIGKILLed and restarted while a run
trains, and the coordinator's run store still accounts for every unit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.local_cluster import REPO, python_env

SOAK_SECONDS = 90.0


def run_soak(tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    """Run bench/soak.py; on a timeout it gets SIGTERM, which makes it end its children."""
    out = tmp_path / "soak.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "soak.py"), *args,
                             "--workdir", str(tmp_path / "work"), "--json", str(out)],
                            cwd=REPO, env=python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=SOAK_SECONDS)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"soak took more than {SOAK_SECONDS:.0f}s:\n{output}")
    return proc.returncode, output, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.slow
def test_quick_soak_kills_and_restarts_nodes_and_loses_no_unit(tmp_path):
    rc, output, data = run_soak(tmp_path, "--quick", "--timeout", "60")
    assert rc == 0, output
    assert "ledger check: passed" in output
    assert data["ledger_ok"] and all(check["ok"] for check in data["checks"])
    totals = data["totals"]
    assert totals["rounds"] == 40
    assert totals["units_completed"] + totals["units_discarded"] == totals["units_planned"] == 320
    assert totals["kills"] >= 1 and totals["restarts"] >= 1
    assert len(data["samples"]) >= 1  # the coordinator was sampled from /proc


def test_a_buffered_soak_records_each_round_and_pass_of_its_stream(tmp_path):
    rc, output, data = run_soak(tmp_path, "--quick", "--mode", "buffered", "--rounds", "60",
                                "--kill-every", "0.3", "--timeout", "60")
    assert rc == 0, output
    names = {check["name"]: check["ok"] for check in data["checks"]}
    assert names["each round took its results"] and names["every earlier pass settled"]
    assert all(names.values()), data["checks"]
    assert data["totals"]["units_completed"] == 60 * 9  # 3 versions of 3 results per round
