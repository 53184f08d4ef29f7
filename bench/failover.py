"""The leader killed at seeded random moments: every run must end at a standby as if
nothing had happened.

Two coordinators share a throwaway PostgreSQL store (devtools/postgres_cluster.py) and two
compute nodes; the client is given both. For each trial the leader gets SIGKILL (or
SIGSTOP, then SIGCONT once the standby leads) at a moment drawn from the trial's seed,
uniformly over the reference run's length. Each trial checks:

- the client ended with the run's result (exit 0);
- sync runs (--deterministic): the final weights are bit-identical to the same recipe run
  once, uninterrupted, on one coordinator with the SQLite store; asynchronous runs: the
  final validation error lies within the spread of uninterrupted runs of --spread seeds;
- the ledger audit (devtools/ledger_audit.py, plain SQL on the database): every unit
  completed once or discarded, none lost, no attempt left open;
- takeover: seconds from the signal to the first unit a node accepts afterwards (every
  unit accepted after the old leader stopped came from the new one), p50 and p99;
- kept work: the results of the round in flight that the new leader took up instead of
  computing them again (coordinator/kept_results.py), and those it computed again although
  the old leader's ledger held them as completed: in round 1, which no checkpoint precedes
  (its results are not kept), and in later rounds (their keeping had not been written yet).

Usage: python bench/failover.py [--recipe letters|dcgan|async] [--kills 50] [--stops 10]
       [--seed 1] [--lease 6] [--json FILE]
Exit status 1 when a trial fails a check.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from tempfile import mkdtemp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

from devtools import local_cluster as procs  # noqa: E402
from devtools.ledger_audit import RunShape, audit  # noqa: E402
from devtools.postgres_cluster import PostgresCluster  # noqa: E402
from thrift_trainer.coordinator.leadership import LEASE_SECONDS  # noqa: E402
from thrift_trainer.training.outputs.model_file import load_model  # noqa: E402

CONFIGS = REPO / "configs"
RECIPES = {  # client arguments, schedule mode, and whether the bits must match
    "letters": (["--config", str(CONFIGS / "letters_recommended.yaml")], "sync", True),
    "dcgan": (["--config", str(CONFIGS / "dcgan_mnist_tiny.yaml"), "--set", "run.rounds=40"],
              "sync", True),
    "async": (["--config", str(CONFIGS / "letters_async.yaml")], "async", False),
}
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
ACCEPTED = re.compile(STAMP + r"node INFO unit \S+ round \d+ (accepted|done)")
LEADING = re.compile(STAMP + r"coordinator WARNING leading the run store")
TAKEN_OVER = re.compile(STAMP + r"coordinator WARNING run \S+ taken over")
TAKEN_UP = re.compile(r"round \d+ takes up (\d+) results kept")
CLIENT_SECONDS = 600.0


@dataclass
class Trial:
    index: int
    signal: str
    moment: float  # seconds after the run started
    completed: bool
    same_result: bool
    audit_ok: bool
    takeover_seconds: float | None  # to the new leader's first unit (None: none was left)
    detail: str = ""
    resumed_seconds: float | None = None  # to the new leader's "taken over" line
    taken_up: int = 0  # results of the round in flight the new leader did not compute again
    redone: int = 0  # results the old leader had completed that were computed again, after
    redone_first: int = 0  # round 1, and in round 1 (no checkpoint before it: none kept)

    @property
    def ok(self) -> bool:
        return self.completed and self.same_result and self.audit_ok


class Bench:
    """The nodes, the database server and the reference, shared by every trial."""

    def __init__(self, workdir: Path, recipe: str, lease: float) -> None:
        self.workdir, self.recipe, self.lease = workdir, recipe, lease
        self.args, self.mode, self.bitwise = RECIPES[recipe]
        self.shape: RunShape | None = None  # known from the reference run
        self.pg = PostgresCluster().start()
        self.nodes = [procs.start_node(workdir, f"node{i}", 0.0, "--seed", str(i))
                      for i in (1, 2)]
        self.nodes_file = procs.write_nodes_file(workdir / "compute_nodes.txt", self.nodes)
        self._log_offsets = [0, 0]

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self.pg.remove()

    # ------------------------------------------------------------- reference
    def reference(self, seeds: list[int]) -> tuple[float, list[dict]]:
        """Uninterrupted runs on one coordinator with the SQLite store: how long one
        lasts (from its start on the coordinator), and each one's weights and validation
        error."""
        coordinator = procs.start_coordinator(self.workdir, self.nodes_file, 2,
                                              *self._deterministic(), name="reference")
        try:
            results = []
            for seed in seeds:
                run_id = f"reference-{seed}"
                done = procs.run_client(["127.0.0.1", str(coordinator.port), *self.args,
                                         *self._seed(seed), "--run-id", run_id, "--json"],
                                        self.workdir, timeout=CLIENT_SECONDS)
                if done.returncode != 0:
                    raise SystemExit(f"the reference run failed: {done.stderr}")
                result = json.loads(done.stdout)
                results.append({"seconds": result["wall_seconds"],  # the run's own span
                                "error": result["validation_error"],
                                "weights": load_model(self.workdir / "models" /
                                                      f"{run_id}.npz")[0]})
                self.shape = RunShape(result["rounds"], self._units_per_round(run_id),
                                      self.mode)
            return statistics.median(r["seconds"] for r in results), results
        finally:
            coordinator.stop()

    def _units_per_round(self, run_id: str) -> int:
        """Units a round of the reference run kept (sync: all it planned; asynchronous:
        the results a round takes), from its SQLite store."""
        with closing(sqlite3.connect(self.workdir / "runs" / "runs.db")) as db:
            return db.execute("SELECT completed_units FROM rounds WHERE run_id = ? AND "
                              "round = 1", (run_id,)).fetchone()[0]

    def _seed(self, seed: int) -> list[str]:
        return [] if seed == 1 else ["--set", f"delta_avg.seed={seed}"]

    # ----------------------------------------------------------------- trial
    def trial(self, index: int, how: str, moment: float, reference: list[dict]) -> Trial:
        url = self._database(index)
        a = self._coordinator(url, f"a{index}")
        a.wait_for("leading: this coordinator leads", timeout=60)
        b = self._coordinator(url, f"b{index}")
        b.wait_for("standing by", timeout=60)
        run_id = f"trial-{index}"
        client = subprocess.Popen(
            [sys.executable, str(REPO / "client.py"), "127.0.0.1,127.0.0.1",
             f"{a.port},{b.port}", *self.args, "--run-id", run_id, "--json", "--poll", "0.5"],
            cwd=self.workdir, env=procs.python_env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            a.wait_for(f"run {run_id}: ", timeout=60)
            self._skip_node_logs()
            time.sleep(moment)  # the seeded moment, from the run's start
            stopped_at = datetime.now()
            a.popen.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            if how == "stop":  # (a run that had ended before the signal is not taken over)
                b.wait_for("leading the run store", timeout=120)
                a.popen.send_signal(signal.SIGCONT)  # it wakes to a lost lease
            out, err = client.communicate(timeout=CLIENT_SECONDS)
            return self._judge(index, how, moment, client.returncode, out, err, url, run_id,
                               reference, stopped_at, b)
        finally:
            if client.poll() is None:
                client.kill()
            for proc in (a, b):
                if proc.popen.poll() is None:
                    proc.popen.send_signal(signal.SIGCONT)
                proc.stop()

    def _judge(self, index: int, how: str, moment: float, code: int, out: str, err: str,
               url: str, run_id: str, reference: list[dict], stopped_at: datetime,
               standby: procs.Proc) -> Trial:
        if code != 0:
            return Trial(index, how, moment, False, False, False, None, err.strip()[-300:])
        result = json.loads(out)
        if self.bitwise:
            weights = load_model(self.workdir / "models" / f"{run_id}.npz")[0]
            expected = reference[0]["weights"]
            same = weights.keys() == expected.keys() and all(
                np.array_equal(weights[k], expected[k]) for k in expected)
        else:
            errors = [r["error"] for r in reference]
            same = min(errors) - 0.01 <= result["validation_error"] <= max(errors) + 0.01
        ledger = audit(url, run_id, self.shape)
        failed = [f"{c.name}: {c.detail}" for c in ledger.checks if not c.ok]
        taken = [_stamp(m) for m in map(TAKEN_OVER.match, standby.log().splitlines()) if m]
        return Trial(index, how, moment, True, same, ledger.ok,
                     self._takeover(stopped_at, standby), "; ".join(failed),
                     (taken[-1] - stopped_at).total_seconds() if taken else None,
                     sum(int(m[1]) for m in TAKEN_UP.finditer(standby.log())),
                     *_redone(url, run_id))

    def _coordinator(self, url: str, name: str) -> procs.Proc:
        return procs.start_coordinator(self.workdir, self.nodes_file, 2, "--store", url,
                                       *self._deterministic(), "--lease", str(self.lease),
                                       run_dir=self.workdir / f"runs-{name}", name=name)

    def _deterministic(self) -> list[str]:
        """--deterministic where the bits must match (an asynchronous run cannot be)."""
        return ["--deterministic"] if self.bitwise else []

    def _database(self, index: int) -> str:
        with psycopg.connect(self.pg.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE trial_{index}")
        return self.pg.url.rsplit("/", 1)[0] + f"/trial_{index}"

    def _skip_node_logs(self) -> None:
        self._log_offsets = [len(node.log()) for node in self.nodes]

    def _takeover(self, stopped_at: datetime, standby: procs.Proc) -> float | None:
        """Seconds from the signal to the first unit a node accepted from the new leader
        (after the standby took the lead: units the old leader sent just before the
        signal may be accepted a moment after it)."""
        led = [_stamp(m) for m in map(LEADING.match, standby.log().splitlines()) if m]
        if not led:
            return None
        after, first = max(stopped_at, led[-1]), None
        for node, offset in zip(self.nodes, self._log_offsets, strict=True):
            for line in node.log()[offset:].splitlines():
                match = ACCEPTED.match(line)
                if match and _stamp(match) > after and (first is None or _stamp(match) < first):
                    first = _stamp(match)
        return None if first is None else (first - stopped_at).total_seconds()


def _redone(url: str, run_id: str) -> tuple[int, int]:
    """Completed attempts a resume made stale (results the ledger held but nobody kept):
    after round 1, and in round 1."""
    with psycopg.connect(url) as db:
        return db.execute("SELECT count(*) FILTER (WHERE round > 1), count(*) FILTER (WHERE "
                          "round = 1) FROM attempts WHERE run_id = %s AND status = 'stale' AND "
                          "reason LIKE 'its result was lost with the coordinator%%'",
                          (run_id,)).fetchone()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _stamp(match: re.Match) -> datetime:
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="letters")
    parser.add_argument("--kills", type=int, default=50, help="trials with SIGKILL")
    parser.add_argument("--stops", type=int, default=10, help="trials with SIGSTOP")
    parser.add_argument("--seed", type=int, default=1, help="seed of the moments")
    parser.add_argument("--lease", type=float, default=LEASE_SECONDS,
                        help=f"the coordinators' --lease (default {LEASE_SECONDS:g})")
    parser.add_argument("--spread", type=int, default=3,
                        help="async: uninterrupted runs whose errors make the spread")
    parser.add_argument("--json", default=None, help="write the trials here")
    args = parser.parse_args(argv)
    # SIGTERM ends the bench like Ctrl-C: the finally below ends every process it started
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    bench = Bench(Path(mkdtemp(prefix="failover-")), args.recipe, args.lease)
    try:
        seeds = [1] if RECIPES[args.recipe][2] else list(range(1, args.spread + 1))
        length, reference = bench.reference(seeds)
        print(f"{args.recipe}: an uninterrupted run lasts {length:.1f} s", flush=True)
        rng = random.Random(args.seed)
        trials = []
        for index in range(args.kills + args.stops):
            how = "kill" if index < args.kills else "stop"
            trial = bench.trial(index, how, rng.uniform(0.05, 0.9) * length, reference)
            trials.append(trial)
            print(f"trial {index:3d} {how} at {trial.moment:5.2f}s: "
                  f"{'ok' if trial.ok else 'FAILED'} taken over after "
                  f"{_seconds(trial.resumed_seconds)}, first unit after "
                  f"{_seconds(trial.takeover_seconds)}, {trial.taken_up} results taken up, "
                  f"{trial.redone} redone ({trial.redone_first} in round 1) {trial.detail}",
                  flush=True)
    finally:
        bench.close()
    return report(trials, args)


def report(trials: list[Trial], args: argparse.Namespace) -> int:
    for how in ("kill", "stop"):
        mine = [t for t in trials if t.signal == how]
        times = [t.takeover_seconds for t in mine if t.takeover_seconds is not None]
        resumed = [t.resumed_seconds for t in mine if t.resumed_seconds is not None]
        if mine:
            print(f"{how}: {len(mine)} trials, {sum(t.ok for t in mine)} ok, completed "
                  f"{sum(t.completed for t in mine)}, same result "
                  f"{sum(t.same_result for t in mine)}, audit ok {sum(t.audit_ok for t in mine)};"
                  f" to the first unit ({len(times)} trials had units left) p50 "
                  f"{percentile(times, 50):.2f} s, p99 {percentile(times, 99):.2f} s, max "
                  f"{max(times, default=float('nan')):.2f} s; to the takeover p50 "
                  f"{percentile(resumed, 50):.2f} s, p99 {percentile(resumed, 99):.2f} s "
                  f"(lease {args.lease:g} s); results of the round in flight taken up "
                  f"{sum(t.taken_up for t in mine)}, completed ones computed again "
                  f"{sum(t.redone for t in mine)} after round 1 and "
                  f"{sum(t.redone_first for t in mine)} in round 1")
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(t), "ok": t.ok} for t in trials],
                                              indent=2) + "\n")
    return 0 if all(t.ok for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
