"""The MD-GAN paper's MNIST comparison at small scale, through the real system.

Methods (the paper's Section V, MNIST): a standalone GAN with batch b and with N x b (one
process, the whole training part), FL-GAN (``fl_gan``: federated averaging of whole GANs,
one local epoch per round) and MD-GAN (``md_gan``: one generator on the coordinator, one
discriminator per worker, k = 1 and k = floor(log2 N) generated batches per iteration,
discriminators swapped between nodes every epoch). Groups of configurations, in the order
they run:

  n5     DCGAN-28 (the CNN), N = 5: standalone b and 5b, FL-GAN, MD-GAN k = 1 and k = 2
  swap   MD-GAN k = 2 without swaps (the n5 run has them)
  crash  MD-GAN k = 2, one node killed (by PID) every I/N iterations
  n1     N = 1: FL-GAN and MD-GAN
  n10    N = 10: standalone 10b, FL-GAN, MD-GAN k = 1 and k = 3
  mlp    the paper's MLP GAN (mlpgan28), N = 5: standalone b, FL-GAN, MD-GAN k = 1 and 2

FL-GAN and MD-GAN run as real processes on 127.0.0.1 (compute nodes, coordinator, client,
``OMP_NUM_THREADS=1``, every process ended by its PID); the standalone GAN runs in this
process. Every ``eval_every`` iterations the generator is scored with the project's frozen
MNIST classifier (IS, FID on its features and logits, ``eval_n`` images). The x-axis is the
paper's: generator updates (for FL-GAN, local steps of each worker's generator).

Each configuration's results go to ``<out>/<key>.json``; a configuration whose file holds
the same settings is skipped, so the grid can be run in pieces (``--groups``,
``--max-minutes``). The report (curves per group as PNG, a Markdown table and, for MD-GAN,
the bytes per iteration counted at the transport against the paper's Table III) is
written between the GENERATED markers of ``--page``.

    python bench/mdgan_paper.py --groups n5 --iterations 1500      # the main comparison
    python bench/mdgan_paper.py --report-only                       # redraw the page
    python bench/mdgan_paper.py --quick --out /tmp/q --page /tmp/q/page.md   # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import torch  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools import local_cluster  # noqa: E402
from devtools.machine import describe  # noqa: E402
from thrift_trainer.training.baselines import standalone_gan  # noqa: E402
from thrift_trainer.training.data import mnist  # noqa: E402
from thrift_trainer.training.models import gan_models  # noqa: E402
from thrift_trainer.training.outputs import gan_metrics  # noqa: E402
from thrift_trainer.wire import stats as wire_stats  # noqa: E402

GROUPS = ("n5", "swap", "crash", "n1", "n10", "mlp")
LR, BETAS = 2e-4, (0.5, 0.999)
FLOAT32 = 4
BEGIN, END = "<!-- BEGIN GENERATED: bench/mdgan_paper.py -->", "<!-- END GENERATED -->"
METRICS = ("inception_score", "fid_features", "fid_logits")
# The RPCs that carry MD-GAN's per-iteration batches and feedback, and its swaps.
TRAIN_METHOD = "train_with_weights"
SWAP_METHOD = "import_session"


@dataclass(frozen=True)
class Experiment:
    """One configuration; ``key`` names its results file (a configuration may appear in
    the plots of several groups, e.g. the standalone GAN with batch b)."""

    key: str
    label: str
    method: str  # standalone | fl_gan | md_gan
    model: str
    workers: int  # N (1 for the standalone GAN)
    batch: int  # b per worker; the standalone GAN's own batch
    iterations: int
    k: int = 1
    swap: bool = True
    crash: bool = False
    swap_optimizer: bool = True  # Adam's state moves with a swapped D (md_gan's default)


@dataclass(frozen=True)
class Settings:
    """What every configuration of one invocation shares."""

    batch: int
    eval_every: int
    eval_n: int
    seed: int
    cnn: str
    mlp: str
    swap_every_epochs: float = 1.0
    disc_steps: int = 1
    local_epochs: int = 1


def floor_log2(n: int) -> int:
    """The paper's k = floor(log2 N), at least 1 (N = 1 gives one batch)."""
    return max(1, int(math.floor(math.log2(n)))) if n > 1 else 1


def group_members(group: str, settings: Settings, its: int) -> list[Experiment]:
    """The configurations shown in one group's plot and table, in the order they run."""
    b, mlp = settings.batch, group == "mlp"
    model, arch = (settings.mlp, "mlp") if mlp else (settings.cnn, "cnn")
    n = {"n1": 1, "n10": 10}.get(group, 5)
    k = floor_log2(n)

    def standalone(batch: int, note: str = "") -> Experiment:
        return Experiment(f"{arch}-standalone-b{batch}-i{its}", f"standalone b={batch}{note}",
                          "standalone", model, 1, batch, its)

    def fl() -> Experiment:
        return Experiment(f"{arch}-n{n}-flgan-i{its}", f"FL-GAN N={n}", "fl_gan", model, n, b,
                          its)

    def md(k_: int, swap: bool = True, crash: bool = False) -> Experiment:
        tag = "-noswap" if not swap else "-crash" if crash else ""
        note = ", no swap" if not swap else ", a crash every I/N" if crash else ""
        return Experiment(f"{arch}-n{n}-mdgan-k{k_}{tag}-i{its}", f"MD-GAN N={n} k={k_}{note}",
                          "md_gan", model, n, b, its, k_, swap, crash)

    if group in ("n5", "mlp", "n10"):
        return _unique([standalone(b), standalone(n * b, " (N x b)"), fl(), md(1), md(k)])
    if group == "swap":
        return [md(k), md(k, swap=False)]
    if group == "crash":
        return [standalone(b), standalone(n * b, " (N x b)"), md(k), md(k, crash=True)]
    if group == "n1":
        return [standalone(b), fl(), md(1)]
    raise ValueError(f"unknown group {group!r}; known: {', '.join(GROUPS)}")


def quick_members(settings: Settings) -> list[Experiment]:
    """The smoke test: every method once with the tiny MLP GAN, N = 2, a crash and swaps.
    The MLP's D (12,881 values) is big enough that Thrift's per-tensor framing (~60 B a
    tensor) stays within the 5 % the byte test allows; the tiny DCGAN's D (1,014 values)
    is not."""
    b, its, model = settings.batch, 6, settings.mlp
    return [
        Experiment(f"quick-standalone-b{b}", f"standalone b={b}", "standalone", model, 1, b,
                   its),
        # One round of 62 local steps: b = 64 keeps the local epoch short.
        Experiment("quick-n2-flgan", "FL-GAN N=2", "fl_gan", model, 2, 64, 62),
        # Swaps without Adam's state, so that they carry exactly Table III's |theta|.
        Experiment("quick-n2-mdgan-k1", "MD-GAN N=2 k=1", "md_gan", model, 2, b, its, 1,
                   swap_optimizer=False),
        Experiment("quick-n2-mdgan-k1-crash", "MD-GAN N=2 k=1, a crash", "md_gan", model, 2, b,
                   its, 1, crash=True),
    ]


def _unique(experiments: list[Experiment]) -> list[Experiment]:
    seen: set[str] = set()
    return [e for e in experiments if not (e.key in seen or seen.add(e.key))]


# ------------------------------------------------------------------ scoring


def score(g: torch.nn.Module, n: int) -> dict[str, float]:
    """IS and FID of ``n`` images from fixed noise, as the algorithms' ``score`` does."""
    images = gan_models.sample_images(g, n, seed=gan_metrics.SCORE_SEED)
    return gan_metrics.score_images(images, n).to_dict()


def due(every: int, iteration: int, last: int) -> bool:
    return iteration == last or (every > 0 and iteration % every == 0)


# ------------------------------------------------------------------ standalone GAN


def run_standalone(exp: Experiment, settings: Settings) -> dict[str, Any]:
    """The project's standalone GAN (training/baselines/standalone_gan.py) in this process: the
    alternating D/G step of FL-GAN's workers on the whole training part, scored like the
    distributed runs."""
    torch.set_num_threads(1)
    curve: list[dict[str, Any]] = []
    started = time.monotonic()

    def on_iteration(iteration: int, g: torch.nn.Module) -> None:
        if due(settings.eval_every, iteration, exp.iterations):
            curve.append({"iteration": iteration, **score(g, settings.eval_n),
                          "seconds": time.monotonic() - started})
            _progress(exp, curve[-1])

    standalone_gan.train_standalone_gan(exp.model, exp.batch, exp.iterations,
                                        seed=settings.seed, lr=LR, betas=BETAS,
                                        on_iteration=on_iteration)
    return {"curve": curve, "seconds": time.monotonic() - started}


def _progress(exp: Experiment, row: dict[str, Any]) -> None:
    print(f"  {exp.key} it {row['iteration']}: IS {row['inception_score']:.2f} "
          f"FID {row['fid_features']:.1f} ({row['seconds']:.0f} s)", file=sys.stderr,
          flush=True)


# ------------------------------------------------------------------ results files


def result_path(out: Path, exp: Experiment, seed: int) -> Path:
    """``<key>.json`` for seed 1, ``<key>-s<seed>.json`` for the others."""
    return out / f"{run_name(exp, seed)}.json"


def run_name(exp: Experiment, seed: int) -> str:
    return exp.key if seed == 1 else f"{exp.key}-s{seed}"


def settings_of(exp: Experiment, settings: Settings) -> dict[str, Any]:
    """Everything that defines a configuration's result; a stored file with other
    settings is run again."""
    return {"experiment": dataclasses.asdict(exp), "settings": dataclasses.asdict(settings)}


def is_done(out: Path, exp: Experiment, settings: Settings) -> bool:
    path = result_path(out, exp, settings.seed)
    if not path.exists():
        return False
    stored = json.loads(path.read_text())
    return {k: stored.get(k) for k in ("experiment", "settings")} == settings_of(exp, settings)


def save_result(out: Path, exp: Experiment, settings: Settings, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = result_path(out, exp, settings.seed)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**settings_of(exp, settings), **result}, indent=1) + "\n")
    os.replace(tmp, path)  # a run cut off half-way never leaves a file that looks finished


def machine() -> str:
    """The CPU and software a result was measured with."""
    return describe(f"torch {torch.__version__}")


# ------------------------------------------------------------------ the command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"comma-separated groups to run, in order (default: all of "
                             f"{', '.join(GROUPS)}); the report shows every group")
    parser.add_argument("--iterations", type=int, default=1000,
                        help="generator updates per configuration (default 1000)")
    parser.add_argument("--group-iterations", default="",
                        help="per-group overrides, e.g. n10=600,mlp=800")
    parser.add_argument("--batch", type=int, default=32, help="b, images per worker batch")
    parser.add_argument("--eval-every", type=int, default=100,
                        help="iterations between IS/FID evaluations (default 100)")
    parser.add_argument("--eval-n", type=int, default=1000, help="images scored (default 1000)")
    parser.add_argument("--seeds", type=_seeds, default=[1],
                        help="comma-separated seeds, each a whole run of every configuration "
                        "(default 1); the report gives mean and standard deviation over the "
                        "seeds finished")
    parser.add_argument("--at", type=_seeds, default=None,
                        help="generator updates at which the report's table compares the "
                        "configurations (default: every 1000, or the last)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "mdgan_paper",
                        help="folder of the per-configuration JSON results")
    parser.add_argument("--page", type=Path, default=REPO / "docs" / "mdgan_results.md",
                        help="Markdown page whose GENERATED block receives the report")
    parser.add_argument("--images", type=Path, default=None,
                        help="folder of the PNG curves (default: <page folder>/images)")
    parser.add_argument("--max-minutes", type=float, default=0.0,
                        help="start no new configuration after this many minutes (0: no limit)")
    parser.add_argument("--only", default="", help="comma-separated keys to run (others skip)")
    parser.add_argument("--report-only", action="store_true", help="only redraw the report")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: tiny models, N = 2, a few iterations (about a minute)")
    return parser.parse_args(argv)


def _seeds(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def settings_from(args: argparse.Namespace) -> Settings:
    if args.quick:
        # A swap every 3 iterations: E = 0.006 of a 500-iteration local epoch.
        return Settings(batch=8, eval_every=3, eval_n=200, seed=args.seeds[0],
                        cnn="dcgan28-tiny", mlp="mlpgan28-tiny", swap_every_epochs=0.006)
    return Settings(batch=args.batch, eval_every=args.eval_every, eval_n=args.eval_n,
                    seed=args.seeds[0], cnn="dcgan28", mlp="mlpgan28")


def plan(args: argparse.Namespace, settings: Settings) -> dict[str, list[Experiment]]:
    """Group name -> its configurations."""
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    overrides = dict(item.split("=") for item in args.group_iterations.split(",") if item)
    if args.quick:
        return {"quick": quick_members(settings)}
    return {g: group_members(g, settings, int(overrides.get(g, args.iterations)))
            for g in groups}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (and SIGINT, which a shell ignores in background jobs) unwinds like Ctrl-C,
    # so the `finally` blocks end every process this run started, by its PID.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = settings_from(args)
    groups = plan(args, settings)
    images = args.images or args.page.parent / "images"
    if not args.report_only:
        run_all(groups, settings, args)
    # The page shows every group's finished configurations, not only this invocation's,
    # so running the grid in pieces never drops what earlier pieces measured.
    everything = groups if args.quick else plan(
        argparse.Namespace(**{**vars(args), "groups": ",".join(GROUPS)}), settings)
    write_report(everything, settings, args.out, args.page, images, args.seeds, args.at)
    print(f"report written to {args.page}", file=sys.stderr)
    return 0


def _interrupt(signum: int, frame: object) -> None:  # noqa: ARG001 - signal signature
    raise KeyboardInterrupt(f"signal {signum}")


def run_all(groups: dict[str, list[Experiment]], settings: Settings,
            args: argparse.Namespace) -> None:
    """Run every configuration not already done, seed after seed (so a grid cut short
    holds whole seeds), in order, within the time budget. Each result records the
    machine, the load average before and after, and when it ran."""
    started = time.monotonic()
    only = {k for k in args.only.split(",") if k}
    for seed in args.seeds:
        seeded = dataclasses.replace(settings, seed=seed)
        for exp in _unique([e for members in groups.values() for e in members]):
            if (only and exp.key not in only) or is_done(args.out, exp, seeded):
                continue
            name = run_name(exp, seed)
            if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
                print(f"time budget spent; not starting {name}", file=sys.stderr)
                continue
            with claimed(args.out, name) as mine:
                if not mine:
                    print(f"{name} is running in another process; skipped", file=sys.stderr)
                    continue
                print(f"running {name} ...", file=sys.stderr, flush=True)
                context = {"machine": machine(), "load_before": os.getloadavg(),
                           "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
                result = RUNNERS[exp.method](exp, seeded)
                save_result(args.out, exp, seeded,
                            {**result, **context, "load_after": os.getloadavg()})
            print(f"done {name} in {result['seconds']:.0f} s", file=sys.stderr, flush=True)


@contextlib.contextmanager
def claimed(out: Path, name: str) -> Iterator[bool]:
    """Claim a run with ``<name>.running`` (holding our PID), so that several
    invocations can share one grid; a claim whose process is gone is taken over."""
    out.mkdir(parents=True, exist_ok=True)
    marker = out / f"{name}.running"
    for _ in range(2):  # the second try follows the removal of a dead owner's claim
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _alive(marker):
                yield False
                return
            marker.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        try:
            yield True
        finally:
            marker.unlink(missing_ok=True)
        return
    yield False


def _alive(marker: Path) -> bool:
    try:
        os.kill(int(marker.read_text() or "0"), 0)
    except (ValueError, ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------ runs through the system

CLIENT_TIMEOUT = 3 * 3600.0  # seconds; a run that takes longer has hung


def fl_steps_per_round(exp: Experiment, settings: Settings) -> int:
    """Generator updates of each FL-GAN worker per round: its local epochs over its shard
    of the training part, whole batches only (as fl_gan trains)."""
    return (mnist.N_TRAIN // exp.workers) // exp.batch * settings.local_epochs


def rounds_of(exp: Experiment, settings: Settings) -> tuple[int, int]:
    """(rounds, iterations per round): MD-GAN's round is one iteration; FL-GAN's is a
    local epoch of every worker."""
    if exp.method == "fl_gan":
        per_round = fl_steps_per_round(exp, settings)
        return max(1, round(exp.iterations / per_round)), per_round
    return exp.iterations, 1


def client_sets(exp: Experiment, settings: Settings) -> dict[str, Any]:
    """The client's --set overrides of one configuration."""
    rounds, per_round = rounds_of(exp, settings)
    section = exp.method
    sets: dict[str, Any] = {
        "run.algorithm": exp.method, "run.model": exp.model, "run.dataset": "mnist",
        "run.rounds": rounds, "run.seed": settings.seed,
        f"{section}.workers": exp.workers, f"{section}.batch_size": exp.batch,
        "outputs.eval_every": max(1, round(settings.eval_every / per_round)),
        "outputs.eval_n": settings.eval_n, "outputs.sample_every": rounds,
        "outputs.checkpoint_every": rounds,
    }
    if exp.method == "md_gan":
        sets.update({"md_gan.k": exp.k, "md_gan.disc_steps": settings.disc_steps,
                     "md_gan.swap_every_epochs": settings.swap_every_epochs,
                     "md_gan.swap": exp.swap, "md_gan.swap_optimizer": exp.swap_optimizer})
    else:
        sets["fl_gan.local_epochs"] = settings.local_epochs
    return sets


def nested(sets: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"a.b": v} -> {"a": {"b": v}}: a recipe file of the client's layout."""
    out: dict[str, dict[str, Any]] = {}
    for dotted, value in sets.items():
        section, key = dotted.split(".", 1)
        out.setdefault(section, {})[key] = value
    return out


@contextlib.contextmanager
def wire_stats_env(path_template: str) -> Iterator[None]:
    """Processes started inside the block write their wire counters to the template."""
    old = os.environ.get(wire_stats.ENV_PATH)
    os.environ[wire_stats.ENV_PATH] = path_template
    os.environ[wire_stats.ENV_EVERY] = "0.5"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(wire_stats.ENV_PATH, None)
        else:
            os.environ[wire_stats.ENV_PATH] = old
        os.environ.pop(wire_stats.ENV_EVERY, None)


def run_cluster(exp: Experiment, settings: Settings, timings: bool = False) -> dict[str, Any]:
    """N nodes, a coordinator and the client on 127.0.0.1; every process ended by PID.
    ``timings``: also each round's phases and its units' round trips
    (bench/gan_iteration_cost.py)."""
    with tempfile.TemporaryDirectory(prefix="mdgan-paper-") as tmp:
        workdir = Path(tmp)
        (workdir / "wire").mkdir()
        nodes: list[local_cluster.Proc] = []
        coordinator = None
        try:
            with wire_stats_env(str(workdir / "wire" / "wire-{pid}.json")):
                nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, "--seed",
                                                  str(i + 1), "--log-level", "WARNING")
                         for i in range(exp.workers)]
                nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
                # Long deadlines: an FL-GAN unit is a whole local epoch, and a loaded
                # machine must not turn slow units into failures. No update-norm guard:
                # early feedback norms move by more than its factor.
                coordinator = local_cluster.start_coordinator(
                    workdir, nodes_file, 2, "--no-speculation", "--deadline-floor", "600",
                    "--rpc-timeout", "900", "--max-update-norm", "0", "--log-level",
                    "WARNING")
            started = time.monotonic()
            result, crashes = _train(exp, settings, workdir, coordinator, nodes)
            seconds = time.monotonic() - started
            extra = _round_timings(workdir) if timings else {}
        finally:
            for proc in [coordinator, *nodes]:
                if proc is not None:
                    proc.stop()  # SIGTERM: a clean exit writes the final wire counters
        roles = {coordinator.popen.pid: "coordinator",
                 **{n.popen.pid: f"node{i}" for i, n in enumerate(nodes)}}
        wire = read_wire_stats(workdir / "wire", roles)
    rounds, per_round = rounds_of(exp, settings)
    curve = [{"iteration": row["round"] * per_round, "round": row["round"],
              "seconds": None, **{m: row[m] for m in METRICS}}
             for row in result["history"] if "fid_features" in row]
    return {"curve": curve, "seconds": seconds, "rounds": rounds,
            "iterations_per_round": per_round, "wall_seconds": result["wall_seconds"],
            "round_seconds": [row["seconds"] for row in result["history"]],
            "crashes": crashes, "nodes": result["nodes"], "wire": wire, **extra}


def _train(exp: Experiment, settings: Settings, workdir: Path, coordinator: local_cluster.Proc,
           nodes: list[local_cluster.Proc]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the client to the end (killing nodes on schedule for the crash experiment)."""
    recipe = workdir / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(nested(client_sets(exp, settings))))
    command = [sys.executable, str(REPO / "client.py"), "127.0.0.1", str(coordinator.port),
               "--config", str(recipe), "--json", "--quiet"]
    env = {k: v for k, v in local_cluster.python_env().items()
           if k not in (wire_stats.ENV_PATH, wire_stats.ENV_EVERY)}
    with subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as client:
        try:
            crashes = _crash_schedule(exp, workdir, nodes, client) if exp.crash else []
            out, err = client.communicate(timeout=CLIENT_TIMEOUT)
        finally:
            if client.poll() is None:
                client.kill()  # only the client we started, by its PID
    if client.returncode != 0:
        logs = "\n".join(p.log()[-2000:] for p in [coordinator, *nodes])
        raise RuntimeError(f"{exp.key}: client failed ({client.returncode}): {err}\n{logs}")
    return json.loads(out), crashes


def _crash_schedule(exp: Experiment, workdir: Path, nodes: list[local_cluster.Proc],
                    client: subprocess.Popen) -> list[dict[str, Any]]:
    """Kill node j (SIGKILL, by PID: a fail-stop crash, its data gone with it) once round
    j * I/N has finished, for j = 1 .. N - 1, as the paper's crash experiment (its last
    crash falls on the last iteration, so it is not made here)."""
    every = exp.iterations // exp.workers
    due_rounds = [j * every for j in range(1, exp.workers)]
    crashes: list[dict[str, Any]] = []
    deadline = time.monotonic() + CLIENT_TIMEOUT
    while due_rounds and client.poll() is None and time.monotonic() < deadline:
        done = _rounds_done(workdir)
        if done >= due_rounds[0]:
            victim = nodes[len(crashes)]
            os.kill(victim.popen.pid, signal.SIGKILL)
            crashes.append({"after_round": done, "node": f"node{len(crashes)}",
                            "port": victim.port})
            due_rounds.pop(0)
        time.sleep(0.05)
    return crashes


def _round_timings(workdir: Path) -> dict[str, list[Any]]:
    """Each round's seconds per phase (engine/phase_clock.py, from metrics.jsonl),
    and its completed units' (start, end) times from the run store."""
    rows = [json.loads(line) for line in
            next((workdir / "runs").glob("*/metrics.jsonl")).read_text().splitlines()
            if line.strip()]
    with contextlib.closing(sqlite3.connect(workdir / "runs" / "runs.db")) as db:
        attempts = db.execute("SELECT round, started, ended FROM attempts WHERE status = "
                              "'completed' ORDER BY round, started").fetchall()
    return {"phase_seconds": [row.get("phase_seconds", {}) for row in rows],
            "attempts": [list(a) for a in attempts]}


def _rounds_done(workdir: Path) -> int:
    """Rounds the coordinator has recorded, from its run's metrics.jsonl."""
    files = list((workdir / "runs").glob("*/metrics.jsonl"))
    if not files:
        return 0
    with open(files[0], "rb") as f:
        return sum(1 for _ in f)


def read_wire_stats(folder: Path, roles: dict[int, str]) -> dict[str, Any]:
    """Every process's counters by method, under its role (coordinator, node0, ...)."""
    out: dict[str, Any] = {}
    for path in sorted(folder.glob("wire-*.json")):
        snapshot = json.loads(path.read_text())
        role = roles.get(snapshot["pid"], f"pid{snapshot['pid']}")
        out[role] = {"totals": snapshot["totals"], "by_method": snapshot["by_method"]}
    return out


RUNNERS: dict[str, Callable[[Experiment, Settings], dict[str, Any]]] = {
    "standalone": run_standalone, "fl_gan": run_cluster, "md_gan": run_cluster}


# ------------------------------------------------------------------ the report

PANELS = (("inception_score", "IS (higher is better)"),
          ("fid_features", "FID, classifier features (lower is better)"),
          ("fid_logits", "FID, classifier logits (lower is better)"))


def load_results(out: Path, members: list[Experiment], settings: Settings,
                 seeds: list[int]) -> list[tuple[Experiment, list[dict[str, Any]]]]:
    """The configurations among ``members`` with a finished run, each with its finished
    seeds' stored results, in seed order."""
    found = []
    for exp in members:
        runs = [json.loads(result_path(out, exp, seed).read_text()) for seed in seeds
                if is_done(out, exp, dataclasses.replace(settings, seed=seed))]
        if runs:
            found.append((exp, runs))
    return found


def seed_curve(runs: list[dict[str, Any]], metric: str
               ) -> tuple[list[int], list[float], list[float]]:
    """(iterations, mean, standard deviation) over the runs, at the iterations every run
    scored (standard deviation 0 for a single run)."""
    values: dict[int, list[float]] = {}
    for run in runs:
        for row in run["curve"]:
            values.setdefault(row["iteration"], []).append(row[metric])
    xs = sorted(i for i, v in values.items() if len(v) == len(runs))
    return (xs, [statistics.fmean(values[i]) for i in xs],
            [statistics.stdev(values[i]) if len(runs) > 1 else 0.0 for i in xs])


def plot_group(name: str, results: list[tuple[Experiment, list[dict[str, Any]]]],
               path: Path) -> Path:
    """IS and both FIDs against generator updates: per configuration the mean over its
    seeds, and a band of one standard deviation either side."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.2))
    for exp, runs in results:
        style = "--" if exp.method == "standalone" else ":" if exp.method == "fl_gan" else "-"
        label = f"{exp.label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        for ax, (metric, _) in zip(axes, PANELS, strict=True):
            xs, mean, sd = seed_curve(runs, metric)
            line, = ax.plot(xs, mean, style, marker=".", label=label)
            if len(runs) > 1:
                ax.fill_between(xs, [m - d for m, d in zip(mean, sd, strict=True)],
                                [m + d for m, d in zip(mean, sd, strict=True)],
                                color=line.get_color(), alpha=0.15, lw=0)
        for crash in runs[0].get("crashes", []):  # when each node was killed
            for ax in axes:
                ax.axvline(crash["after_round"], color="grey", lw=0.6)
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("generator updates (iterations)")
        if metric != "inception_score":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"MNIST, group {name}: mean over seeds, band of one standard deviation",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def mean_sd(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def report_points(results: list[tuple[Experiment, list[dict[str, Any]]]],
                  at: list[int] | None) -> list[int]:
    """The update counts the table compares at: ``at``, else every 1,000 up to the
    group's longest run, else its last update."""
    if at:
        return at
    last = max(exp.iterations for exp, _ in results)
    return list(range(1000, last + 1, 1000)) or [last]


def scores_table(results: list[tuple[Experiment, list[dict[str, Any]]]],
                 at: list[int]) -> list[str]:
    """FID (features) at each of ``at`` updates and IS at the last, mean ± standard
    deviation over the finished seeds."""
    head = " | ".join(f"FID feat. @ {n:,}" for n in at)
    lines = [f"| configuration | N | k | b | seeds | {head} | IS @ {at[-1]:,} | wall s |",
             "|---|---:|---:|---:|---:|" + "---:|" * (len(at) + 2)]
    for exp, runs in results:
        def at_update(run: dict[str, Any], n: int, metric: str) -> list[float]:
            return [row[metric] for row in run["curve"] if row["iteration"] == n]

        fids = [mean_sd([v for run in runs for v in at_update(run, n, "fid_features")], 1)
                for n in at]
        score = mean_sd([v for run in runs for v in at_update(run, at[-1],
                                                               "inception_score")], 2)
        k = exp.k if exp.method == "md_gan" else "-"
        wall = statistics.fmean(run["seconds"] for run in runs)
        lines.append(f"| {exp.label} | {exp.workers} | {k} | {exp.batch} | {len(runs)} | "
                     f"{' | '.join(fids)} | {score} | {wall:.0f} |")
    return lines


def write_report(groups: dict[str, list[Experiment]], settings: Settings, out: Path,
                 page: Path, images: Path, seeds: list[int], at: list[int] | None) -> None:
    """Curves and tables of every finished configuration, into the page's GENERATED block."""
    lines = [f"Settings: b = {settings.batch} per worker, IS/FID on n = {settings.eval_n} "
             f"images every {settings.eval_every} iterations, seeds "
             f"{', '.join(map(str, seeds))} (mean ± standard deviation over the seeds "
             f"finished), Adam {LR} ({BETAS[0]}, {BETAS[1]}), L = {settings.disc_steps}, "
             f"E = {settings.swap_every_epochs} epoch, FL-GAN {settings.local_epochs} local "
             "epoch per round.", ""]
    for name, members in groups.items():
        results = load_results(out, members, settings, seeds)
        if all(exp.method == "standalone" for exp, _ in results):
            continue  # nothing of its own finished: its standalone runs are other groups'
        image = plot_group(name, results, images / f"mdgan_{name}.png")
        rel = os.path.relpath(image, page.parent)
        lines += [f"### Group {name}", "", f"![group {name}]({rel})", "",
                  *scores_table(results, report_points(results, at)), ""]
    every = _unique([e for members in groups.values() for e in members])

    def first_runs(method: str) -> list[tuple[Experiment, dict[str, Any]]]:
        return [(e, runs[0]) for e, runs in load_results(
            out, [e for e in every if e.method == method], settings, seeds)]

    lines += bytes_section(first_runs("md_gan"))
    lines += fl_bytes_section(first_runs("fl_gan"))
    _replace_block(page, lines)


def _replace_block(page: Path, lines: list[str]) -> None:
    block = "\n".join([BEGIN, *lines, END])
    text = page.read_text() if page.exists() else f"# MD-GAN results\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(head + block + tail)


def discriminator_sizes(model: str) -> dict[str, int]:
    """|theta| of D in float32 values: parameters and buffers (what a swap must move), and
    Adam's state (two moments per parameter and a step count per parameter tensor)."""
    _, d = gan_models.build_gan(gan_models.gan_spec(model))
    params = sum(p.numel() for p in d.parameters())
    buffers = sum(b.numel() for b in d.buffers())
    return {"params": params, "buffers": buffers, "theta": params + buffers,
            "adam": 2 * params + len(list(d.parameters()))}


def measured_bytes(exp: Experiment, wire: dict[str, Any]) -> dict[str, float]:
    """Bytes per message of each MD-GAN exchange, from the transport's counters: per
    training call (one worker, one iteration) down and up, as the coordinator counted
    them, and per discriminator sent in a swap, as the sending nodes counted them."""
    coordinator = wire["coordinator"]["by_method"]
    down = coordinator.get(f"{TRAIN_METHOD} call", {})
    up = coordinator.get(f"{TRAIN_METHOD} reply", {})
    # Node to node, or relayed by the coordinator when a node cannot accept connections.
    swaps = [node["by_method"].get(f"{SWAP_METHOD} call", {}) for node in wire.values()]
    swap_bytes = sum(s.get("sent_bytes", 0) for s in swaps)
    swap_frames = sum(s.get("sent_frames", 0) for s in swaps)
    return {"calls": down.get("sent_frames", 0),
            "down": down.get("sent_bytes", 0) / max(1, down.get("sent_frames", 0)),
            "up": up.get("received_bytes", 0) / max(1, up.get("received_frames", 0)),
            "swaps": swap_frames, "swap": swap_bytes / max(1, swap_frames),
            "total_down": down.get("sent_bytes", 0), "total_up": up.get("received_bytes", 0),
            "total_swap": swap_bytes}


def formula_bytes(exp: Experiment) -> dict[str, int]:
    """Table III with d = one image in float32 bytes: 2bd down and bd up per worker and
    iteration, |theta| per discriminator swapped (Adam's state reported apart)."""
    d = 28 * 28 * FLOAT32
    sizes = discriminator_sizes(exp.model)
    adam = sizes["adam"] * FLOAT32 if exp.swap_optimizer else 0
    return {"down": 2 * exp.batch * d, "up": exp.batch * d, "theta": sizes["theta"] * FLOAT32,
            "adam": adam, "swap": (sizes["theta"] + sizes["adam"]) * FLOAT32 if adam
            else sizes["theta"] * FLOAT32}


def bytes_section(results: list[tuple[Experiment, dict[str, Any]]]) -> list[str]:
    """MD-GAN's bytes per iteration, counted at the transport, against Table III."""
    rows = [(e, r) for e, r in results if r.get("wire", {}).get("coordinator")]
    if not rows:
        return []
    lines = ["### Bytes on the wire (MD-GAN), counted at the transport", "",
             "Bytes per message (frame header and Thrift framing included): C->W and W->C "
             "per training call (one worker, one iteration), W->W per discriminator sent in "
             "a swap. Formulas: 2bd and bd with d = 784 x 4 B; |theta| x 4 B (parameters and "
             "buffers of D) plus, where it moves, Adam's state (2 moments per parameter and "
             "a step count per tensor), shown apart.", "",
             "| configuration | model | calls | C->W measured / 2bd | W->C measured / bd | "
             "D sent in swaps | W->W measured / formula | formula: theta + Adam |",
             "|---|---|---:|---|---|---:|---|---|"]
    for exp, result in rows:
        got, want = measured_bytes(exp, result["wire"]), formula_bytes(exp)
        swap = (f"{got['swap']:,.0f} / {want['swap']:,} ({got['swap'] / want['swap']:.4f}x)"
                if got["swaps"] else "-")
        lines.append(
            f"| {exp.label} | {exp.model} | {got['calls']:,} | {got['down']:,.0f} / "
            f"{want['down']:,} "
            f"({got['down'] / want['down']:.4f}x) | {got['up']:,.0f} / {want['up']:,} "
            f"({got['up'] / want['up']:.4f}x) | {got['swaps']:,} | {swap} | "
            f"{want['theta']:,} + {want['adam']:,} |")
    return [*lines, ""]


def gan_values(model: str) -> int:
    """|w| + |theta|: float32 values of G's and D's parameters and buffers."""
    g, d = gan_models.build_gan(gan_models.gan_spec(model))
    return sum(t.numel() for m in (g, d) for t in m.state_dict().values())


def fl_bytes_section(results: list[tuple[Experiment, dict[str, Any]]]) -> list[str]:
    """FL-GAN's bytes per worker and round against Table III's |w| + |theta| each way."""
    rows = [(e, r) for e, r in results if r.get("wire", {}).get("coordinator")]
    if not rows:
        return []
    lines = ["FL-GAN, per worker and round (Table III: |w| + |theta| each way, parameters and "
             "buffers of G and D, x 4 B):", "",
             "| configuration | model | calls | C->W measured / formula | "
             "W->C measured / formula |",
             "|---|---|---:|---|---|"]
    for exp, result in rows:
        methods = result["wire"]["coordinator"]["by_method"]
        down, up = methods[f"{TRAIN_METHOD} call"], methods[f"{TRAIN_METHOD} reply"]
        want = gan_values(exp.model) * FLOAT32
        per_down = down["sent_bytes"] / down["sent_frames"]
        per_up = up["received_bytes"] / up["received_frames"]
        lines.append(f"| {exp.label} | {exp.model} | {down['sent_frames']} | "
                     f"{per_down:,.0f} / {want:,} "
                     f"({per_down / want:.4f}x) | {per_up:,.0f} / {want:,} "
                     f"({per_up / want:.4f}x) |")
    return [*lines, ""]


if __name__ == "__main__":
    sys.exit(main())
