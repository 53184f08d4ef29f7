"""Asynchronous and buffered training (`schedule.mode`) against synchronous rounds, through
the real system, under simulated load.

Part 1, letters: configs/letters_recommended.yaml on 4 compute nodes with loads
0.2/0.4/0.6/0.8 under the random policy (1: a node never rejects, it delays a unit by
`--load-delay` seconds with probability load_prob), a coordinator and the client, all
separate processes on 127.0.0.1, once per mode and seed. Modes: sync with backup attempts
(the coordinator's default), sync without (`--no-speculation`), async (one version per
result), buffered with buffer 2 and with buffer 3. The asynchronous modes apply each
result (or buffer) on its own, so they take a smaller server step (`delta_avg.server_lr`,
see SERVER_LR); sync keeps the recipe unchanged. Measured: the wall time from the
client's start until the validation error first reaches the target (0.10), from the
timestamps of the coordinator's "round N/M: validation error" log lines; median over seeds.

Part 2, DCGAN-28 (sync_sgd, MNIST) on 2 nodes, one of them `--slowdown 3`: sync rounds of
K = N = 2 units against buffered mode with buffer 2, each for the same wall-clock budget
(the client is then stopped by SIGINT, which cancels the run); images/s and FID
(n = `--gan-eval-n`, scored every `--gan-eval-every` rounds) at equal wall time.

    python bench/async_vs_sync.py [--seeds 1,2,3] [--modes sync-backups,async,...]
                                  [--rounds 10] [--gan-budget 150] [--quick]

Results go to bench/results/async_vs_sync.json (with --quick: async_vs_sync.quick.json),
the plot of validation error against wall time to docs/images/async_vs_sync.png, and a
markdown table to stdout; progress lines go to stderr. Every process started is ended by
its PID, also on an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402
from devtools.machine import cpu_model  # noqa: E402

REPO = local_cluster.REPO
RECIPE = REPO / "configs" / "letters_recommended.yaml"
GAN_RECIPE = REPO / "configs" / "dcgan_mnist.yaml"
RESULTS = REPO / "bench" / "results" / "async_vs_sync.json"
QUICK_RESULTS = REPO / "bench" / "results" / "async_vs_sync.quick.json"
PLOT = REPO / "docs" / "images" / "async_vs_sync.png"
LOADS = (0.2, 0.4, 0.6, 0.8)
POLICY = 1  # random: never rejects, delays a unit with probability load_prob
TARGET = 0.10
CLIENT_TIMEOUT = 900.0  # seconds one letters run may take
STOP_WAIT = 30.0  # seconds a stopped client may take to cancel its run and exit

# The server step of each asynchronous mode (delta_avg.server_lr; the recipe's is 1.0 with
# momentum 0.5). A sync round applies the mean of 11 deltas once; async applies every delta
# on its own, buffered every mean of b, so ~11 / b steps a round: 1.0 diverges in async
# mode. About b / 11 keeps a round's total step the sync one's; short runs on unloaded
# nodes (docs/benchmarks.md) found it better than 1.5x or 1.7x that.
SERVER_LR = {"async": 0.1, "buffered-2": 0.2, "buffered-3": 0.3, "async-no-backups": 0.1}


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    coordinator: tuple[str, ...] = ()  # extra coordinator arguments
    sets: tuple[str, ...] = ()  # client --set items (the server step comes from SERVER_LR)


MODES = {m.name: m for m in (
    Mode("sync-backups", "sync, backups"),
    Mode("sync-no-backups", "sync, no backups", ("--no-speculation",)),
    Mode("async", "async", (), ("schedule.mode=async",)),
    Mode("buffered-2", "buffered, buffer 2", (),
         ("schedule.mode=buffered", "schedule.buffer_size=2")),
    Mode("buffered-3", "buffered, buffer 3", (),
         ("schedule.mode=buffered", "schedule.buffer_size=3")),
    # not in the default set: how much of async's lead the backup attempts make
    Mode("async-no-backups", "async, no backups", ("--no-speculation",),
         ("schedule.mode=async",)),
)}
DEFAULT_MODES = ("sync-backups", "sync-no-backups", "async", "buffered-2", "buffered-3")
QUICK_MODES = ("sync-no-backups", "async", "buffered-2")

# The coordinator's INFO lines (its log format: "%(asctime)s coordinator LEVEL message")
ROUND_LINE = re.compile(r"^(\S+ \S+) coordinator INFO round (\d+)/\d+: validation error "
                        r"(\S+) \((\d+) units, (\d+) discarded")
SCORE_LINE = re.compile(r"^(\S+ \S+) coordinator INFO round (\d+) scores: (.*)$")
STAMP = "%Y-%m-%d %H:%M:%S,%f"
UNIT_DONE = re.compile(r"node INFO unit \S+ round \d+ done")


# ------------------------------------------------------------------ pure functions


def parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; ArgumentTypeError on anything else."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"give distinct seeds >= 0, e.g. 1,2,3; got {text!r}")
    return seeds


def parse_modes(text: str) -> list[str]:
    """Comma-separated mode names, in the given order; ArgumentTypeError names a bad one."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(
            f"modes are distinct names of {', '.join(MODES)}; got {text!r}")
    return modes


def parse_policies(text: str) -> list[int]:
    """'2,3' -> [2, 3]: coordinator policies 1 (random), 2 (round robin), 3 (adaptive)."""
    try:
        policies = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        policies = []
    if not policies or any(p not in (1, 2, 3) for p in policies) \
            or len(set(policies)) != len(policies):
        raise argparse.ArgumentTypeError(f"give distinct policies of 1, 2, 3; got {text!r}")
    return policies


def parse_server_lr(text: str) -> tuple[str, float]:
    """'async=0.1' -> ('async', 0.1), for an asynchronous mode only."""
    name, sep, value = text.partition("=")
    if not sep or name not in SERVER_LR:
        raise argparse.ArgumentTypeError(
            f"give MODE=LR with MODE one of {', '.join(SERVER_LR)}; got {text!r}")
    try:
        lr = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: LR must be a number") from None
    if not (math.isfinite(lr) and lr > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: LR must be positive")
    return name, lr


def client_sets(mode: str, server_lr: dict[str, float], rounds: int, seed: int,
                extra: Sequence[str] = ()) -> list[str]:
    """The client's --set items of one letters run."""
    sets = [f"run.rounds={rounds}", f"run.seed={seed}", *MODES[mode].sets]
    if mode in server_lr:
        sets.append(f"delta_avg.server_lr={server_lr[mode]}")
    return [*sets, *extra]


def stamp_seconds(stamp: str) -> float:
    """A log line's asctime ('2026-11-24 06:10:01,234') as a time.time() value."""
    return datetime.strptime(stamp, STAMP).timestamp()


def round_rows(log: str, started: float) -> list[dict[str, float]]:
    """Each round the coordinator logged: its number, validation error, results applied,
    results discarded, and when it was logged, in seconds after ``started``."""
    rows = []
    for line in log.splitlines():
        if match := ROUND_LINE.match(line):
            rows.append({"round": int(match.group(2)), "error": float(match.group(3)),
                         "results": int(match.group(4)), "discarded": int(match.group(5)),
                         "elapsed": round(stamp_seconds(match.group(1)) - started, 3)})
    return rows


def score_rows(log: str, started: float) -> list[dict[str, float]]:
    """Each round's offline scores the coordinator logged ('round N scores: k v, ...'),
    with when they were logged, in seconds after ``started``."""
    rows = []
    for line in log.splitlines():
        if match := SCORE_LINE.match(line):
            scores = {}
            for item in match.group(3).split(","):
                key, _, value = item.strip().partition(" ")
                try:
                    scores[key] = float(value)
                except ValueError:
                    continue
            rows.append({"round": int(match.group(2)), **scores,
                         "elapsed": round(stamp_seconds(match.group(1)) - started, 3)})
    return rows


def time_to_reach(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first time (of (time, error) points in time order) whose error is at most
    ``target``, or None when none is."""
    for elapsed, error in points:
        if not math.isnan(error) and error <= target:
            return elapsed
    return None


def median_or_none(values: Sequence[float | None]) -> float | None:
    """The median, an unreached run (None) counting as later than any reached one; None
    when the median itself is unreached."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    n = len(ordered)
    middle = ordered[(n - 1) // 2: n // 2 + 1]
    if any(v is None for v in middle):
        return None
    return statistics.mean(middle)  # type: ignore[arg-type]


def last_at_or_before(rows: Sequence[dict[str, float]], budget: float, key: str
                      ) -> dict[str, float] | None:
    """The last row with ``key`` logged at or before ``budget`` seconds, or None."""
    kept = [r for r in rows if key in r and r["elapsed"] <= budget]
    return kept[-1] if kept else None


def images_per_second(rounds: Sequence[dict[str, float]], images_per_result: int,
                      budget: float) -> float | None:
    """Images of the results applied between the first logged round and the last one at
    or before ``budget``, per second of that span (start-up and round 1 excluded)."""
    kept = [r for r in rounds if r["elapsed"] <= budget]
    if len(kept) < 2:
        return None
    span = kept[-1]["elapsed"] - kept[0]["elapsed"]
    results = sum(r["results"] for r in kept[1:])
    return results * images_per_result / span if span > 0 else None


def first_round_at(rounds: Sequence[dict[str, float]], target: float) -> int | None:
    """The first round (of the coordinator's round rows) whose error is at most ``target``."""
    reached = time_to_reach([(r["round"], r["error"]) for r in rounds], target)
    return None if reached is None else int(reached)


def fmt_seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"


def letters_table(summary: dict[str, dict[str, Any]], target: float) -> str:
    """Markdown: per mode, time to reach the target per seed and the median, the final
    error, and the ratios against the sync modes."""
    rows = [f"| mode | server_lr | seconds to error <= {target:.2f}, per seed | median s | "
            "vs sync, no backups | vs sync, backups | rounds to reach it (median) | "
            "s / round (median) | final error (median) | results applied / discarded |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    base = {name: summary.get(name, {}).get("median") for name in
            ("sync-no-backups", "sync-backups")}
    for name, s in summary.items():
        ratios = []
        for ref in ("sync-no-backups", "sync-backups"):
            if name == ref:
                ratios.append("baseline")
            elif s["median"] is None or base[ref] is None:
                ratios.append("-")
            else:
                ratios.append(f"{base[ref] / s['median']:.2f}x sooner"
                              if s["median"] <= base[ref] else
                              f"{s['median'] / base[ref]:.2f}x later")
        rows.append(f"| {MODES[name].label} | {s['server_lr']:g} | "
                    f"{', '.join(fmt_seconds(v) for v in s['seconds'])} | "
                    f"{fmt_seconds(s['median'])} | {ratios[0]} | {ratios[1]} | "
                    f"{'not reached' if s['rounds_to_target'] is None else s['rounds_to_target']}"
                    f" | {s['seconds_per_round']:.2f} | {s['final_error']:.4f} | "
                    f"{s['results']} / {s['discarded']} |")
    return "\n".join(rows)


def gan_table(runs: dict[str, dict[str, Any]], budget: float) -> str:
    rows = [f"| mode | rounds in {budget:g} s | results applied | units fast / slow node | "
            "images/s | FID features at equal wall time (round, s) | FID logits | IS |",
            "|---|---:|---:|---|---:|---|---:|---:|"]
    for name, r in runs.items():
        score = r.get("score_at_budget")
        fid = ("-" if score is None else
               f"{score['fid_features']:.1f} (round {score['round']}, {score['elapsed']:.0f} s)")
        ips = "-" if r.get("images_per_second") is None else f"{r['images_per_second']:.0f}"
        units = r.get("units_done_by_node", {})
        rows.append(f"| {name} | {r['rounds_in_budget']} | {r['results_in_budget']} | "
                    f"{units.get('fast', '-')} / {units.get('slow', '-')} | {ips} | "
                    f"{fid} | "
                    f"{'-' if score is None else format(score['fid_logits'], '.1f')} | "
                    f"{'-' if score is None else format(score['inception_score'], '.2f')} |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=parse_seeds, default=None,
                        help="run.seed of the client, the coordinator's policy seed and "
                             "(x 10 + i) the load seed of node i; one letters run per seed "
                             "and mode (default 1,2,3; --quick: the first only)")
    parser.add_argument("--modes", type=parse_modes, default=None,
                        help=f"comma-separated, of {', '.join(MODES)} (default: all but "
                             "async-no-backups; "
                             f"--quick: {','.join(QUICK_MODES)})")
    parser.add_argument("--rounds", type=int, default=10,
                        help="rounds of a letters run (default 10)")
    parser.add_argument("--target", type=float, default=TARGET,
                        help="validation error whose first reaching is timed (default 0.10)")
    parser.add_argument("--load-delay", type=float, default=3.0,
                        help="seconds of a simulated load delay (default 3)")
    parser.add_argument("--server-lr", type=parse_server_lr, action="append", default=[],
                        metavar="MODE=LR", help="server step of an asynchronous mode "
                        f"(repeatable; defaults: "
                        f"{', '.join(f'{k}={v:g}' for k, v in SERVER_LR.items())})")
    parser.add_argument("--no-load", action="store_true",
                        help="nodes at load 0 (for tuning server_lr quickly)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a further client --set for every letters run")
    parser.add_argument("--gan-budget", type=float, default=75.0,
                        help="wall-clock seconds of each DCGAN run (default 75; 0: no DCGAN "
                             "part)")
    parser.add_argument("--gan-policies", type=parse_policies, default=[2, 3],
                        help="coordinator policies of the DCGAN runs, each with both modes "
                             "(default 2,3: round robin, adaptive)")
    parser.add_argument("--gan-unit", type=int, default=64,
                        help="images per DCGAN work unit, in minibatches of 32 (default 64)")
    parser.add_argument("--gan-eval-every", type=int, default=40,
                        help="DCGAN rounds between FID scorings (default 40)")
    parser.add_argument("--gan-eval-n", type=int, default=500,
                        help="generated images per FID scoring (default 500)")
    parser.add_argument("--gan-seed", type=int, default=1,
                        help="seed of the DCGAN runs (default 1)")
    parser.add_argument("--letters", action=argparse.BooleanOptionalAction, default=True,
                        help="run the letters part (default: yes)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2 rounds, seed 1, modes "
                             f"{','.join(QUICK_MODES)}, 15 s of DCGAN-28-tiny per mode, one "
                             "policy; "
                             "results to async_vs_sync.quick.json, no plot")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"results file (default {RESULTS.relative_to(REPO)})")
    parser.add_argument("--report", type=Path, default=None, metavar="JSON",
                        help="run nothing: print the tables of a results file (and draw "
                             "the plot to --plot)")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"plot file (default {PLOT.relative_to(REPO)}; none with "
                             "--quick unless given)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The arguments, with --quick's settings and the default paths filled in."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.gan_budget < 0 or args.gan_eval_every < 1 or args.gan_eval_n < 2:
        parser.error("--gan-budget >= 0, --gan-eval-every >= 1, --gan-eval-n >= 2")
    args.server_lr = {**SERVER_LR, **dict(args.server_lr)}
    args.gan_model = "dcgan28"
    args.seeds = args.seeds or [1, 2, 3]
    args.modes = args.modes or list(QUICK_MODES if args.quick else DEFAULT_MODES)
    if args.quick:
        args.rounds, args.seeds = 2, args.seeds[:1]
        args.gan_model, args.gan_eval_every, args.gan_eval_n = "dcgan28-tiny", 10, 200
        args.gan_budget, args.gan_policies = min(args.gan_budget, 15.0), args.gan_policies[:1]
    if args.json is None:
        args.json = QUICK_RESULTS if args.quick else RESULTS
    if args.plot is None and not args.quick:
        args.plot = PLOT
    return args


# ------------------------------------------------------------------ processes


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    """The processes of one run; `stop` ends every one of them by its PID."""

    procs: list[local_cluster.Proc] = field(default_factory=list)
    client: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.client is not None and self.client.poll() is None:
            self.client.kill()  # this PID only
            self.client.wait(10)
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except Exception as error:  # noqa: BLE001 - go on ending the others
                progress(f"could not stop pid {proc.popen.pid}: {error}")


@contextmanager
def cluster() -> Iterator[Cluster]:
    running = Cluster()
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt, so the `finally` blocks end every process."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_client(args: list[str], workdir: Path, log: Path) -> subprocess.Popen:
    """client.py with `args`, its stdout to `log` (its stderr to `log`.err)."""
    with open(log, "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        return subprocess.Popen([sys.executable, str(REPO / "client.py"), *args],
                                cwd=workdir, env=local_cluster.python_env(), stdout=out,
                                stderr=err, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so that the client (Python)
    turns it into KeyboardInterrupt and cancels its run even when this script was started
    in the background (`cmd &`), where the shell makes SIGINT ignored and children inherit
    that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_client(client: subprocess.Popen, timeout: float, what: str) -> None:
    try:
        client.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: the client did not finish within {timeout:.0f} s") from None


def run_letters(mode: str, seed: int, args: argparse.Namespace, workdir: Path
                ) -> dict[str, Any]:
    """One letters run: nodes, coordinator (INFO log, for its round lines) and client."""
    workdir.mkdir(parents=True)
    loads = [0.0] * len(LOADS) if args.no_load else list(LOADS)
    with cluster() as c:
        for i, load in enumerate(loads):
            c.procs.append(local_cluster.start_node(
                workdir, f"node{i + 1}", load, "--load-delay", str(args.load_delay),
                "--seed", str(seed * 10 + i), "--log-level", "WARNING"))
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", c.procs)
        coordinator = local_cluster.start_coordinator(
            workdir, nodes_file, POLICY, "--seed", str(seed), "--log-level", "INFO",
            *MODES[mode].coordinator)
        c.procs.append(coordinator)
        sets = client_sets(mode, args.server_lr, args.rounds, seed, args.set)
        out = workdir / "client.json"
        started = time.time()
        c.client = start_client(
            ["127.0.0.1", str(coordinator.port), "--config", str(RECIPE), "--json", "--quiet",
             "--out", str(workdir / "models"), *(x for s in sets for x in ("--set", s))],
            workdir, out)
        wait_client(c.client, CLIENT_TIMEOUT, f"{mode} seed {seed}")
        wall = time.time() - started
        if c.client.returncode != 0:
            raise RuntimeError(f"{mode} seed {seed}: the client exited "
                               f"{c.client.returncode}: "
                               f"{out.with_suffix('.err').read_text(errors='replace')[-500:]}")
        result = json.loads(out.read_text())
        time.sleep(0.2)  # the coordinator's last lines reach its log
        log = coordinator.log()
    rounds = round_rows(log, started)
    history = result["history"]
    cumulative, total = [], 0.0
    for row in history:
        total += row["seconds"]
        cumulative.append(round(total, 3))
    return {
        "mode": mode, "seed": seed, "sets": sets,
        "coordinator_args": list(MODES[mode].coordinator),
        "wall_seconds": round(wall, 2), "client_wall_seconds": result["wall_seconds"],
        "rounds": rounds,  # from the coordinator's log: the timed points
        "history_errors": [h["validation_error"] for h in history],
        "history_cumulative_seconds": cumulative,
        "seconds_to_target": time_to_reach(
            [(r["elapsed"], r["error"]) for r in rounds], args.target),
        "cumulative_seconds_to_target": time_to_reach(
            list(zip(cumulative, (h["validation_error"] for h in history), strict=True)),
            args.target),
        "final_error": result["validation_error"],
        "units": result.get("units", {}),
        "nodes": [{k: n.get(k) for k in ("name", "accepted", "rejected", "cancelled")}
                  for n in result.get("nodes", [])],
    }


def run_gan(mode: str, policy: int, args: argparse.Namespace, workdir: Path
            ) -> dict[str, Any]:
    """One DCGAN run for `args.gan_budget` seconds of wall clock, then stopped by SIGINT
    (the client cancels its run); rounds and scores from the coordinator's log, units per
    node from the nodes' INFO lines."""
    workdir.mkdir(parents=True)
    sets = {"run.model": args.gan_model, "run.rounds": 100_000, "run.seed": args.gan_seed,
            "sync_sgd.images_per_work_unit": args.gan_unit, "sync_sgd.batch_size": 32,
            "sync_sgd.num_workunits_per_update": 2, "sync_sgd.units_per_iteration": 2,
            "outputs.eval_every": args.gan_eval_every, "outputs.eval_n": args.gan_eval_n,
            "outputs.sample_every": 0, "outputs.checkpoint_every": 0}
    if mode == "buffered-2":
        sets.update({"schedule.mode": "buffered", "schedule.buffer_size": 2})
    with cluster() as c:
        c.procs.append(local_cluster.start_node(workdir, "fast", 0.0, "--log-level", "INFO",
                                                "--warm-up", args.gan_model))
        c.procs.append(local_cluster.start_node(workdir, "slow", 0.0, "--log-level", "INFO",
                                                "--warm-up", args.gan_model,
                                                "--slowdown", "3"))
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", c.procs)
        coordinator = local_cluster.start_coordinator(
            workdir, nodes_file, policy, "--seed", str(args.gan_seed), "--log-level", "INFO",
            "--no-speculation")
        c.procs.append(coordinator)
        out = workdir / "client.json"
        started = time.time()
        c.client = start_client(
            ["127.0.0.1", str(coordinator.port), "--config", str(GAN_RECIPE), "--json",
             "--quiet", "--out", str(workdir / "models"),
             *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))], workdir, out)
        deadline = started + args.gan_budget
        while time.time() < deadline and c.client.poll() is None:
            time.sleep(0.2)
        if c.client.poll() is not None:
            raise RuntimeError(f"DCGAN {mode}: the client exited {c.client.returncode} "
                               f"before the budget: "
                               f"{out.with_suffix('.err').read_text(errors='replace')[-500:]}")
        c.client.send_signal(signal.SIGINT)  # this PID: it cancels the run and exits 130
        try:
            c.client.wait(STOP_WAIT)
            stop = f"exited {c.client.returncode} after SIGINT"
        except subprocess.TimeoutExpired:  # the rounds logged so far still count
            c.client.kill()
            c.client.wait(10)
            stop = f"killed: still running {STOP_WAIT:g} s after SIGINT"
            progress(f"  DCGAN {mode}: the client was {stop}")
        time.sleep(0.2)
        log = coordinator.log()
        node_units = {name: len(UNIT_DONE.findall(proc.log()))
                      for name, proc in zip(("fast", "slow"), c.procs, strict=False)}
    rounds = round_rows(log, started)
    scores = score_rows(log, started)
    kept = [r for r in rounds if r["elapsed"] <= args.gan_budget]
    return {
        "mode": mode, "policy": policy, "sets": sets, "budget_seconds": args.gan_budget,
        "units_done_by_node": node_units,
        "client_stop": stop,
        "rounds_in_budget": len(kept), "results_in_budget": sum(r["results"] for r in kept),
        "discarded_in_budget": sum(r["discarded"] for r in kept),
        "images_per_second": images_per_second(rounds, args.gan_unit, args.gan_budget),
        "scores": scores, "round_times": [[r["round"], r["elapsed"]] for r in rounds],
        "score_at_budget": last_at_or_before(scores, args.gan_budget, "fid_features"),
    }


# ------------------------------------------------------------------ reporting


def summarise(runs: list[dict[str, Any]], modes: Sequence[str], server_lr: dict[str, float],
              target: float) -> dict[str, dict[str, Any]]:
    summary = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        summary[mode] = {
            "server_lr": server_lr.get(mode, 1.0),
            "seconds": [r["seconds_to_target"] for r in mine],
            "median": median_or_none([r["seconds_to_target"] for r in mine]),
            "cumulative_median": median_or_none([r["cumulative_seconds_to_target"]
                                                 for r in mine]),
            "final_error": statistics.median(r["final_error"] for r in mine),
            "wall_median": statistics.median(r["wall_seconds"] for r in mine),
            "rounds_to_target": median_or_none([first_round_at(r["rounds"], target)
                                                for r in mine]),
            "seconds_per_round": statistics.median(
                r["rounds"][-1]["elapsed"] / len(r["rounds"]) for r in mine if r["rounds"]),
            "results": sum(sum(x["results"] for x in r["rounds"]) for r in mine),
            "discarded": sum(sum(x["discarded"] for x in r["rounds"]) for r in mine),
        }
    return summary


def plot(runs: list[dict[str, Any]], modes: Sequence[str], target: float, path: Path,
         title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = dict(zip(MODES, ("tab:blue", "tab:gray", "tab:red", "tab:orange", "tab:green",
                               "tab:purple"), strict=True))
    for mode in modes:
        for i, run in enumerate(r for r in runs if r["mode"] == mode):
            xs = [0.0] + [p["elapsed"] for p in run["rounds"]]
            ys = [math.nan] + [p["error"] for p in run["rounds"]]
            ax.plot(xs[1:], ys[1:], marker="o", markersize=3, linewidth=1.2, alpha=0.8,
                    color=colours[mode], linestyle=("-", "--", ":")[i % 3],
                    label=MODES[mode].label if i == 0 else None)
    ax.axhline(target, color="black", linewidth=0.8, linestyle="--",
               label=f"target {target:.2f}")
    ax.set_yscale("log")
    ax.set_xlabel("wall time since the client started (s)")
    ax.set_ylabel("validation error")
    ax.set_title(f"{title}\n(one line per seed: solid, dashed, dotted)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict[str, Any]:
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}",
            "date": time.strftime("%Y-%m-%d %H:%M")}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def report(results: dict[str, Any], plot_path: Path | None) -> None:
    """The tables on stdout and the plot, from a results file's contents."""
    settings, gan = results["settings"], results.get("gan", {})
    g = settings["gan"]
    summary = summarise(results["runs"], settings["modes"], settings["server_lr"],
                        settings["target"])
    print(f"nproc {results['machine']['nproc']}, {results['machine']['cpu']}; load average "
          f"before {results['load_average_before']}, after {results['load_average_after']}")
    loads = "/".join(f"{x:g}" for x in settings["loads"])
    if summary:
        print(f"\nLetters, {settings['rounds']} rounds, seeds {settings['seeds']}, loads "
              f"{loads}, {settings['load_delay']:g} s delays, policy {settings['policy']}:\n")
        print(letters_table(summary, settings["target"]))
    done = {mode: r for mode, r in gan.items() if "failed" not in r}
    if done:
        print(f"\nDCGAN ({g['model']}, units of {g['unit']}, 2 nodes, one slowed 3x, no "
              f"backups), {g['budget']:g} s each:\n")
        print(gan_table(done, g["budget"]))
    if plot_path and results["runs"]:
        plot(results["runs"], settings["modes"], settings["target"], plot_path,
             f"letters recommended: 4 nodes, loads {loads}, {settings['load_delay']:g} s "
             f"delays, policy {settings['policy']}; seeds "
             f"{','.join(map(str, settings['seeds']))}")
        progress(f"plot in {plot_path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report(json.loads(args.report.read_text(encoding="utf-8")), args.plot)
        return 0
    results: dict[str, Any] = {
        "machine": machine(), "load_average_before": loadavg(),
        "settings": {"seeds": args.seeds, "modes": args.modes, "rounds": args.rounds,
                     "target": args.target, "loads": [0.0] * 4 if args.no_load else
                     list(LOADS), "load_delay": args.load_delay, "policy": POLICY,
                     "server_lr": args.server_lr, "extra_sets": args.set,
                     "recipe": str(RECIPE.relative_to(REPO)), "quick": args.quick,
                     "gan": {"budget": args.gan_budget, "model": args.gan_model,
                             "unit": args.gan_unit, "eval_every": args.gan_eval_every,
                             "eval_n": args.gan_eval_n, "seed": args.gan_seed,
                             "policies": args.gan_policies, "slowdown": 3}},
    }
    runs: list[dict[str, Any]] = []
    gan: dict[str, dict[str, Any]] = {}

    def save() -> dict[str, dict[str, Any]]:
        """Write what is measured so far (after every run, so a failure keeps the rest)."""
        results["load_average_after"] = loadavg()
        summary = summarise(runs, args.modes, args.server_lr, args.target)
        results.update(summary=summary, runs=runs, gan=gan)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        return summary

    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="async-vs-sync-") as tmp:
        if args.letters:
            for seed in args.seeds:  # seeds outermost: a slow spell hits every mode alike
                for mode in args.modes:
                    progress(f"letters {mode} seed {seed} (load average {loadavg()})")
                    run = run_letters(mode, seed, args, Path(tmp) / f"{mode}-{seed}")
                    runs.append(run)
                    save()
                    progress(f"  error {run['final_error']:.4f} after {len(run['rounds'])} "
                             f"rounds, {run['wall_seconds']:.1f} s; seconds to "
                             f"{args.target:.2f}: {fmt_seconds(run['seconds_to_target'])}")
        if args.gan_budget > 0:
            for policy in args.gan_policies:
                for mode in ("sync", "buffered-2"):
                    key = f"{mode}, policy {policy}"
                    progress(f"DCGAN {key}: {args.gan_budget:g} s "
                             f"(load average {loadavg()})")
                    try:
                        gan[key] = run_gan(mode, policy, args,
                                           Path(tmp) / f"gan-{mode}-{policy}")
                    except RuntimeError as error:  # keep the letters results and the rest
                        progress(f"  DCGAN {key} failed: {error}")
                        gan[key] = {"mode": mode, "policy": policy,
                                    "failed": str(error)[-2000:]}
                        continue
                    finally:
                        save()
                    score = gan[key]["score_at_budget"]
                    progress(f"  {gan[key]['rounds_in_budget']} rounds, "
                             f"{gan[key]['images_per_second'] or 0:.0f} images/s, units by "
                             f"node {gan[key]['units_done_by_node']}, FID "
                             f"{'-' if score is None else format(score['fid_features'], '.1f')}")
    save()
    progress(f"results in {args.json}")
    report(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
