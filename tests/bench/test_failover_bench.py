"""bench/failover.py: the takeover time read from the logs, and the report's verdict
(no process is started)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

_PATH = Path(__file__).resolve().parents[2] / "bench" / "failover.py"
_SPEC = importlib.util.spec_from_file_location("bench_failover", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up
_SPEC.loader.exec_module(bench)

STANDBY_LOG = ("2026-11-26 10:00:00,100 coordinator INFO connection security: ...\n"
               "2026-11-26 10:00:06,500 coordinator WARNING leading the run store "
               "postgresql://trainer@127.0.0.1:5/t (epoch 2)\n")
NODE_LOGS = [
    # accepted just after the signal: a unit the old leader had sent, not the new one's
    "2026-11-26 10:00:00,020 node INFO unit a round 3 accepted, waiting 0.2s\n"
    "2026-11-26 10:00:06,900 node INFO unit b round 3 accepted\n",
    "2026-11-26 10:00:06,700 node INFO unit c round 3 accepted\n"
    "2026-11-26 10:00:07,000 node INFO unit d round 3 done: 10 samples in 0.1s\n",
]


def _logged(text: str) -> SimpleNamespace:
    return SimpleNamespace(log=lambda: text)


def test_the_takeover_ends_at_the_new_leader_s_first_unit() -> None:
    measured = object.__new__(bench.Bench)
    measured.nodes = [_logged(t) for t in NODE_LOGS]
    measured._log_offsets = [0, 0]
    stopped = datetime(2026, 11, 26, 10, 0, 0, 0)
    assert measured._takeover(stopped, _logged(STANDBY_LOG)) == 6.7
    assert measured._takeover(stopped, _logged("")) is None  # the standby never led


def _trial(index: int, ok: bool, seconds: float) -> object:
    return bench.Trial(index, "kill", 1.0, True, ok, True, seconds)


def test_the_report_fails_when_one_trial_does(capsys, tmp_path: Path) -> None:
    args = argparse.Namespace(lease=6.0, json=str(tmp_path / "t.json"))
    assert bench.report([_trial(0, True, 5.0), _trial(1, True, 7.0)], args) == 0
    out = capsys.readouterr().out
    assert "kill: 2 trials, 2 ok" in out and "p50 6.00 s" in out and "max 7.00 s" in out
    assert bench.report([_trial(0, True, 5.0), _trial(1, False, 7.0)], args) == 1
    assert '"ok": false' in (tmp_path / "t.json").read_text()
