"""FedAvg on 100 letters clients: this project through real processes against Flower's
simulation runtime and against a plain in-process loop, on the same clients, weights and
seeds.

The experiment (docs/federated-data.md): the letters training part (train_letters*.txt,
16 features then the label) dealt to ``--clients`` clients by the project's Dirichlet
partitioner (alpha ``--alpha``, the run's seed), ``--per-round`` clients sampled per round
by the project's sampler, each trained ``--epochs`` epochs of plain SGD (batch ``--batch``,
learning rate ``--lr``) on ``mlp_classifier`` (16-64-26), the deltas averaged by examples,
the model scored on validate_letters.txt after every round. Paths, each on every seed:

- ``ours-halves``: a coordinator and 2 compute nodes on 127.0.0.1, one started with
  ``--clients 0-49``, the other with ``--clients 50-99`` (a client's unit goes only to
  its holder);
- ``ours-all``: the same with both nodes holding every client (the coordinator balances);
- ``flower``: ``flwr.simulation.run_simulation`` (Ray backend, 1 CPU per client actor,
  Ray given 2 CPUs), one SuperNode per client, its FedAvg told to train the nodes of the
  same sampled clients (bench/flower_app.py); Flower runs from its own virtual
  environment, ``--flower-venv`` (bench/.venvs/flower), which the full run creates and
  fills with ``flwr[simulation]`` and the project's torch release from the package index;
- ``plain``: the same FedAvg as a loop in this process over the sampled clients (the
  floor), the same code as Flower's ClientApp (bench/flower_app.py).

Every path starts from the project's initial weights (``DeltaAveraging.initial_weights``)
and shuffles each client's examples with the project's ``unit_seed``, so the accuracy
curves agree up to float rounding. Wall time per round: between the ends of consecutive
rounds (the coordinator's log; Flower's central evaluation; the loop's clock), a round
including its validation; the median over rounds 2..R (round 1 pays each path's warm-up)
and the medians over seeds. Our coordinator's own split of a round (metrics.jsonl
``phase_seconds``) is kept. The paths run interleaved, seed by seed, in a rotating order,
every child with OMP_NUM_THREADS=1.

    python bench/flower_compare.py                 # 3 seeds x 30 rounds, installs Flower
    python bench/flower_compare.py --quick         # 3 rounds, 1 seed, ours-halves and the
                                                   # loop; Flower only if already installed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import flower_app  # noqa: E402

from devtools import local_cluster  # noqa: E402
from devtools.machine import describe  # noqa: E402
from devtools.throughput import UNIT_LINE, round_times  # noqa: E402

RESULTS = REPO / "bench" / "results" / "flower_compare.json"
QUICK_RESULTS = REPO / "bench" / "results" / "flower_compare_quick.json"
FLOWER_VENV = REPO / "bench" / ".venvs" / "flower"
FLOWER_SPEC = "flwr[simulation]"
DATA = REPO / "data" / "letters"
PATHS = ("ours-halves", "ours-all", "flower", "plain")
QUICK_PATHS = ("ours-halves", "flower", "plain")
LABELS = {"ours-halves": "this project, 2 nodes holding 50 clients each",
          "ours-all": "this project, 2 nodes holding every client",
          "flower": "Flower simulation (Ray), 2 CPUs",
          "plain": "plain in-process loop (floor)"}
FLOWER_MISSING = "Flower side skipped: {why}"


# ------------------------------------------------------------------ arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, seed 1, ours-halves, flower (when installed) and "
                             "plain; never installs Flower; writes "
                             f"{QUICK_RESULTS.relative_to(REPO)}")
    parser.add_argument("--rounds", type=int, help="rounds per run (default 30; quick 3)")
    parser.add_argument("--seeds", type=_seeds, help="comma-separated run seeds "
                        "(default 1,2,3; quick 1)")
    parser.add_argument("--paths", type=_paths, help=f"comma-separated, of {', '.join(PATHS)} "
                        "(default all; quick: " + ",".join(QUICK_PATHS) + ")")
    parser.add_argument("--clients", type=int, default=100, help="clients (default 100)")
    parser.add_argument("--per-round", type=int, default=10,
                        help="clients per round (default 10)")
    parser.add_argument("--alpha", type=float, default=0.5,
                        help="Dirichlet concentration (default 0.5)")
    parser.add_argument("--epochs", type=int, default=1, help="E, local epochs (default 1)")
    parser.add_argument("--batch", type=int, default=10, help="B, batch size (default 10)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="local plain-SGD learning rate (default 0.05)")
    parser.add_argument("--flower-venv", type=Path, default=FLOWER_VENV,
                        help="Flower's own virtual environment (default "
                             f"{FLOWER_VENV.relative_to(REPO)})")
    parser.add_argument("--flower-spec", default=FLOWER_SPEC,
                        help=f"what pip installs there (default {FLOWER_SPEC!r}; e.g. "
                             "'flwr[simulation]==1.20.0' for an older release)")
    parser.add_argument("--no-install", action="store_true",
                        help="never install Flower: skip its path when it is missing")
    parser.add_argument("--json", type=Path, help="results file (default "
                        f"{RESULTS.relative_to(REPO)}; quick {QUICK_RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 30
    if args.seeds is None:
        args.seeds = [1] if args.quick else [1, 2, 3]
    if args.paths is None:
        args.paths = list(QUICK_PATHS if args.quick else PATHS)
    if args.json is None:
        args.json = QUICK_RESULTS if args.quick else RESULTS
    args.install = not (args.quick or args.no_install)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is the warm-up)")
    if not 1 <= args.per_round <= args.clients or args.clients < 2:
        parser.error("--per-round must be in 1..--clients, and --clients at least 2")
    if args.epochs < 1 or args.batch < 1 or not args.lr > 0 or not args.alpha > 0:
        parser.error("--epochs, --batch, --lr and --alpha must be positive")
    return args


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"distinct seeds >= 0, got {text!r}")
    return seeds


def _paths(text: str) -> list[str]:
    paths = text.split(",")
    unknown = [p for p in paths if p not in PATHS]
    if unknown or len(set(paths)) != len(paths) or not paths:
        raise argparse.ArgumentTypeError(f"distinct paths of {', '.join(PATHS)}, got {text!r}")
    return paths


def client_sets(args: argparse.Namespace, seed: int) -> list[str]:
    """The run's settings, as the client's --set pairs."""
    return ["run.model=mlp_classifier", "run.dataset=letters", "data.format=letters",
            "run.algorithm=delta_avg", f"run.seed={seed}", f"run.rounds={args.rounds}",
            f"delta_avg.epochs={args.epochs}", "delta_avg.local_optimizer=sgd",
            f"delta_avg.eta={args.lr}", f"delta_avg.batch_size={args.batch}",
            f"clients.count={args.clients}", "clients.partition=dirichlet",
            f"clients.alpha={args.alpha}", f"clients.per_round={args.per_round}",
            "outputs.checkpoint_every=0"]


# ------------------------------------------------------------------ the experiment
def write_experiment(args: argparse.Namespace, seed: int, path: Path) -> dict[str, Any]:
    """The experiment file of ``seed``, from the project's own pieces: its letters loader,
    partition, sampler, shuffle seeds and initial weights. Returns the partition's sizes
    and the sampled clients."""
    from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
    from thrift_trainer.training.algorithms.torch_model import setup_of
    from thrift_trainer.training.clients.data_parts import parts_of
    from thrift_trainer.training.clients.settings import settings_from
    from thrift_trainer.training.run_config import load_run_config
    from thrift_trainer.training.units import unit_seed

    config = load_run_config(None, client_sets(args, seed)).to_spec().algorithm_config()
    algorithm = DeltaAveraging("mlp_classifier", config, DATA, "letters")
    setup = setup_of("mlp_classifier", config, "letters", DATA)
    settings = settings_from(config["clients"])
    parts, _ = parts_of(setup, settings, config["seed"])
    sampled = [[int(unit.client.removeprefix("client"))
                for unit in algorithm._plan.round_units(r)]  # the coordinator's own choice
               for r in range(1, args.rounds + 1)]
    seeds = np.array([[unit_seed(config["seed"], r, f"client{c}") for c in range(args.clients)]
                      for r in range(1, args.rounds + 1)])
    train, validation = setup.data.train, setup.data.validation
    flower_app.save_experiment(
        path, x_train=train.inputs.numpy(), y_train=train.targets.numpy(),
        x_val=validation.inputs.numpy(), y_val=validation.targets.numpy(), parts=parts,
        weights=algorithm.initial_weights(), clients=np.array(sampled), seeds=seeds,
        epochs=args.epochs, batch=args.batch, lr=args.lr, hidden=64)
    return {"sizes": [len(p) for p in parts], "sampled": sampled}


# ------------------------------------------------------------------ this project
class Cluster:
    """A coordinator and 2 nodes on 127.0.0.1 that serve one run after another; each
    node started with its ``--clients`` (or none: every client)."""

    def __init__(self, workdir: Path, holdings: list[list[str]]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.procs = workdir, []
        try:
            for i, holds in enumerate(holdings):
                self.procs.append(local_cluster.start_node(workdir, f"node{i}", 0.0,
                                                           "--log-level", "INFO", *holds))
            nodes = local_cluster.write_nodes_file(workdir / "nodes.txt", self.procs)
            self.coordinator = local_cluster.start_coordinator(
                workdir, nodes, 2, "--log-level", "INFO", "--no-speculation")
        except BaseException:
            self.stop()
            raise
        self.procs.append(self.coordinator)

    def train(self, sets: list[str], timeout: float) -> dict[str, Any]:
        seen = [len(proc.lines) for proc in self.procs]
        began = time.perf_counter()
        args = ["127.0.0.1", str(self.coordinator.port)]
        for pair in sets:
            args += ["--set", pair]
        done = local_cluster.run_client([*args, "--json", "--quiet"], local_cluster.REPO,
                                        timeout=timeout)
        client_seconds = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"run failed: {done.stderr}\n{self.coordinator.log()}")
        result = json.loads(done.stdout)
        self.coordinator.wait_for(rf"run {result['run_id']} finished")
        logs = ["".join(proc.lines[first:]) for proc, first in zip(self.procs, seen,
                                                                    strict=True)]
        log = logs[-1]
        unit_seconds: dict[int, list[float]] = {}
        for node_log in logs[:-1]:
            for match in UNIT_LINE.finditer(node_log):
                unit_seconds.setdefault(int(match.group(1)), []).append(float(match.group(2)))
        run_dir = Path(result["coordinator_run_dir"])
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        lines = [json.loads(x) for x in (run_dir / "clients.jsonl").read_text().splitlines()]
        return {"result": result, "ends": round_times(log), "metrics": metrics,
                "clients": lines, "client_seconds": client_seconds, "run_dir": run_dir,
                "unit_seconds": unit_seconds}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


HOLDINGS = {"ours-halves": lambda c: [["--clients", f"0-{c // 2 - 1}"],
                                      ["--clients", f"{c // 2}-{c - 1}"]],
            "ours-all": lambda c: [[], []]}


def run_ours(cluster: Cluster, args: argparse.Namespace, seed: int,
             experiment: dict[str, Any]) -> dict[str, Any]:
    run = cluster.train(client_sets(args, seed), timeout=600 + 30 * args.rounds)
    ends = run["ends"]
    rows = []
    for row, metric in zip(run["result"]["history"], run["metrics"], strict=True):
        r = row["round"]
        rows.append({"round": r, "validation_error": row["validation_error"],
                     "seconds": ends[r] - ends[r - 1] if r - 1 in ends else metric["seconds"],
                     "coordinator_seconds": metric["seconds"],
                     "phases": metric.get("phase_seconds", {}),
                     # the nodes' own times for the round's units (their logs)
                     "unit_seconds": run["unit_seconds"].get(r, [])})
    trained = {}
    for line in run["clients"]:
        if "node" in line:
            trained.setdefault(line["round"], []).append(int(line["client"][6:]))
    same = all(sorted(trained.get(r + 1, [])) == sorted(chosen)
               for r, chosen in enumerate(experiment["sampled"]))
    return {"rounds": rows, "wall_seconds": run["result"]["wall_seconds"],
            "client_seconds": run["client_seconds"], "same_clients": same,
            "dropped_or_failed": sum(1 for x in run["clients"] if "node" not in x),
            "model": str(run["run_dir"] / "model.npz")}


def _weight_difference(model: Path, reference: Path) -> float | None:
    """The largest |ours - plain loop| over the final weights."""
    if not reference.exists():
        return None
    from thrift_trainer.training.outputs.model_file import load_model

    weights, _ = load_model(model)
    plain = json.loads(reference.read_text())
    return max(float(np.max(np.abs(np.asarray(weights[name]) - np.asarray(value))))
               for name, value in plain.items())


# ------------------------------------------------------------------ Flower
def flower_python(args: argparse.Namespace) -> tuple[Path | None, str]:
    """Flower's interpreter and its versions, installing it when allowed; (None, why)
    when it is not there."""
    python = args.flower_venv / "bin" / "python"
    probe = "import flwr, ray, torch; print(flwr.__version__, ray.__version__)"
    if python.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if found.returncode == 0:
            return python, found.stdout.strip()
    if not args.install:
        return None, (f"no flwr with ray in {args.flower_venv} (the full run installs "
                      f"{args.flower_spec} there; --quick and --no-install never do)")
    import torch

    print(f"installing {args.flower_spec} into {args.flower_venv} ...", file=sys.stderr,
          flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(args.flower_venv)], check=True)
    release = torch.__version__.split("+")[0]  # the project's torch, for equal maths
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", args.flower_spec,
                           f"torch=={release}"], capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"pip install {args.flower_spec} failed: {done.stderr[-1500:]}"
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if found.returncode != 0:
        return None, f"flwr does not import: {found.stderr[-1500:]}"
    return python, found.stdout.strip()


def run_flower(python: Path, experiment: Path, workdir: Path, timeout: float
               ) -> dict[str, Any]:
    out, log = workdir / "flower.json", workdir / "flower.log"
    began = time.perf_counter()
    with open(log, "w") as sink:
        done = subprocess.run([str(python), str(REPO / "bench" / "flower_app.py"),
                               str(experiment), str(out), "2", "1"], stdout=sink,
                              stderr=subprocess.STDOUT, env=local_cluster.python_env(),
                              timeout=timeout)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"Flower exited {done.returncode}:\n{log.read_text()[-3000:]}")
    report = json.loads(out.read_text())
    report["process_seconds"] = time.perf_counter() - began
    return report


# ------------------------------------------------------------------ summary
def steady(rows: list[dict[str, Any]]) -> float:
    """The median wall time of rounds 2..R."""
    return statistics.median(r["seconds"] for r in rows if r["round"] >= 2)


def summarise(runs: list[dict[str, Any]], paths: list[str]) -> dict[str, Any]:
    """Per path: medians over seeds of the steady round time, the final accuracy; per
    round, the accuracy's mean over seeds."""
    summary: dict[str, Any] = {}
    for path in paths:
        mine = [r for r in runs if r["path"] == path and "rounds" in r]
        if not mine:
            continue
        rounds = len(mine[0]["rounds"])
        summary[path] = {
            "seconds_per_round": statistics.median(steady(r["rounds"]) for r in mine),
            "seconds_per_round_by_seed": [steady(r["rounds"]) for r in mine],
            "seeds": [r["seed"] for r in mine],
            "first_round_seconds": statistics.median(r["rounds"][0]["seconds"] for r in mine),
            "wall_seconds": statistics.median(r["wall_seconds"] for r in mine),
            "accuracy": [statistics.mean(1 - r["rounds"][i]["validation_error"] for r in mine)
                         for i in range(rounds)],
            "final_accuracy_by_seed": [1 - r["rounds"][-1]["validation_error"] for r in mine],
        }
        if path.startswith("ours"):
            phases: dict[str, list[float]] = {}
            for run in mine:
                for row in run["rounds"][1:]:
                    for name, value in row["phases"].items():
                        phases.setdefault(name, []).append(value)
            summary[path]["phases_median"] = {k: statistics.median(v)
                                              for k, v in phases.items()}
            rows = [row for run in mine for row in run["rounds"][1:] if row["unit_seconds"]]
            if rows:  # the nodes' compute per round: all units' seconds, and the busier node
                summary[path]["unit_seconds_sum_median"] = statistics.median(
                    sum(row["unit_seconds"]) for row in rows)
    return summary


def ratios(summary: dict[str, Any]) -> dict[str, float]:
    """Ours over Flower and over the loop: the medians' ratio, and the median over seeds
    of the same seed's ratio (``paired``: the runs of a seed ran back to back)."""
    out = {}
    for ours in ("ours-halves", "ours-all"):
        if ours not in summary:
            continue
        mine = summary[ours]
        for other in ("flower", "plain"):
            if other not in summary:
                continue
            theirs = summary[other]
            out[f"{ours} / {other}"] = mine["seconds_per_round"] / theirs["seconds_per_round"]
            by_seed = dict(zip(theirs["seeds"], theirs["seconds_per_round_by_seed"],
                               strict=True))
            paired = [s / by_seed[seed] for seed, s in
                      zip(mine["seeds"], mine["seconds_per_round_by_seed"], strict=True)
                      if seed in by_seed]
            if paired:
                out[f"{ours} / {other}, paired"] = statistics.median(paired)
    return out


def report(summary: dict[str, Any], args: argparse.Namespace, notes: list[str]) -> str:
    paths = list(summary)
    lines = ["| path | s / round (median, rounds 2..R) | by seed | round 1 s | "
             "run wall s | final accuracy by seed |", "| --- | ---: | --- | ---: | ---: | --- |"]
    for path in paths:
        s = summary[path]
        lines.append(f"| {LABELS[path]} | {s['seconds_per_round']:.3f} | "
                     + ", ".join(f"{x:.3f}" for x in s["seconds_per_round_by_seed"])
                     + f" | {s['first_round_seconds']:.2f} | {s['wall_seconds']:.1f} | "
                     + ", ".join(f"{x:.4f}" for x in s["final_accuracy_by_seed"]) + " |")
    lines += ["", "| round | " + " | ".join(paths) + " |",
              "| ---: | " + " | ".join("---:" for _ in paths) + " |"]
    for i in range(args.rounds):
        lines.append(f"| {i + 1} | " + " | ".join(f"{summary[p]['accuracy'][i]:.4f}"
                                                  for p in paths) + " |")
    for name, value in ratios(summary).items():
        lines.append(f"\n{name}: **{value:.2f}x**")
    for path in paths:
        if "phases_median" in summary[path]:
            shown = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in
                              summary[path]["phases_median"].items() if v >= 0.0005)
            lines.append(f"\n{path} coordinator phases (median, rounds 2..R): {shown}")
        if "unit_seconds_sum_median" in summary[path]:
            lines.append(f"\n{path} nodes' unit seconds per round, summed (median): "
                         f"{summary[path]['unit_seconds_sum_median'] * 1000:.1f} ms")
    lines += [f"\nnote: {n}" for n in notes]
    return "\n".join(lines)


def order_of(paths: list[str], index: int) -> list[str]:
    """The paths rotated by the seed's position: each path runs first once in turn."""
    k = index % len(paths)
    return paths[k:] + paths[:k]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    notes: list[str] = []
    flower, versions = None, ""
    if "flower" in args.paths:
        flower, versions = flower_python(args)
        if flower is None:
            notes.append(FLOWER_MISSING.format(why=versions))
            print(notes[-1], file=sys.stderr, flush=True)
    runs: list[dict[str, Any]] = []
    clusters: dict[str, Cluster] = {}
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        work = Path(tmp)
        try:
            for path in args.paths:
                if path.startswith("ours"):
                    clusters[path] = Cluster(work / path, HOLDINGS[path](args.clients))
            for index, seed in enumerate(args.seeds):
                experiment = work / f"experiment-{seed}.npz"
                facts = write_experiment(args, seed, experiment)
                reference = work / f"plain-{seed}.json"
                for path in order_of(args.paths, index):
                    print(f"seed {seed}: {path} ...", file=sys.stderr, flush=True)
                    run: dict[str, Any] = {"path": path, "seed": seed}
                    try:
                        if path == "plain":
                            got = flower_app.plain_loop(experiment)
                            reference.write_text(json.dumps(got.pop("final_weights")))
                            run.update(got)
                        elif path == "flower":
                            if flower is None:
                                continue
                            run.update(run_flower(flower, experiment, work,
                                                  timeout=300 + 20 * args.rounds))
                        else:
                            run.update(run_ours(clusters[path], args, seed, facts))
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        run["error"] = str(exc)[-3000:]
                        notes.append(f"{path} seed {seed} failed: {str(exc)[-300:]}")
                        print(notes[-1], file=sys.stderr, flush=True)
                    runs.append(run)
                    if "rounds" in run:
                        print(f"  {steady(run['rounds']):.3f} s/round, final accuracy "
                              f"{1 - run['rounds'][-1]['validation_error']:.4f}",
                              file=sys.stderr, flush=True)
                for run in runs:  # the project's final weights against the loop's
                    if run["seed"] == seed and "model" in run:
                        run["max_weight_difference"] = _weight_difference(
                            Path(run.pop("model")), reference)
        finally:
            for cluster in clusters.values():
                cluster.stop()
    summary = summarise(runs, args.paths)
    text = report(summary, args, notes)
    print(text)
    load_after = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.json.write_text(json.dumps(
        {"machine": machine, "shared": "2-core VM shared with other work",
         "load_average_before": load_before, "load_average_after": load_after,
         "flower_versions": versions if flower is not None else None,
         "settings": settings, "notes": notes, "summary": summary,
         "ratios": ratios(summary), "runs": runs}, indent=2, default=float) + "\n")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
