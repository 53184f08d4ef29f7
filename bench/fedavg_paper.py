"""FedAvg against FedSGD, IID against the pathological non-IID split: McMahan et al. 2017.

"Communication-Efficient Learning of Deep Networks from Decentralized Data" (arXiv
1602.05629), its MNIST 2NN experiment through real processes: the shipped MNIST training
part (8,000 images, data/mnist/README.md; the paper has 60,000) dealt to 100 clients,
either IID (``clients.partition=iid``, 80 images each) or by the paper's pathological
split (``clients.partition=shards``, label-sorted, 2 shards of 40 images per client);
C = 0.1 (10 clients a round); the paper's 2NN (``mlp_classifier``, hidden 200, 200, ReLU,
199,210 parameters); FedSGD (one full-batch gradient step per client and round:
``delta_avg.local_optimizer=gd``, E = 1) and FedAvg with E in {1, 5} local epochs of
minibatch SGD with B in {10, 50}. Each run counts the rounds until the global model's
accuracy on the 2,000 held-out images (1 - validation error) first reaches each target,
and is cancelled once it has reached the highest one or has used its round budget.

A coordinator and 2 compute nodes on 127.0.0.1, the first holding clients 0-49
(``--clients 0-49``), the second 50-99, serve every run one after another; every child
runs with OMP_NUM_THREADS=1 and is ended by its PID. Rounds to a target do not depend on
the machine's speed or load.

    python bench/fedavg_paper.py                 # 10 runs, about 20 minutes on 2 cores
    python bench/fedavg_paper.py --quick         # a check of the bench, under a minute
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.federated_cluster import FederatedCluster  # noqa: E402
from devtools.machine import describe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "fedavg_paper.json"
CLIENTS, PER_ROUND, SEED = 100, 10, 1
PARTITIONS = ("iid", "shards")


@dataclass(frozen=True)
class Config:
    """One row of the paper's Table 2: E local epochs of batches of B (None: the whole
    client, one full-batch step an epoch) with the local optimizer."""

    epochs: int
    batch: int | None

    @property
    def optimizer(self) -> str:
        return "gd" if self.batch is None else "sgd"

    def updates_per_round(self, examples: int) -> float:
        """u = E n / B, the paper's expected local updates per client and round."""
        return self.epochs * (1 if self.batch is None else examples / self.batch)


CONFIGS = {"fedsgd": Config(1, None), "e1-b50": Config(1, 50), "e1-b10": Config(1, 10),
           "e5-b50": Config(5, 50), "e5-b10": Config(5, 10)}
QUICK_RUNS = (("iid", "fedsgd"), ("iid", "e5-b10"), ("shards", "e5-b10"))
# Local learning rates: the best of a few tried on each split (docs/benchmarks.md says
# which), as the paper picks the best rate of a grid for each row.
ETA = {("iid", "fedsgd"): 0.1, ("iid", "e1-b50"): 0.1, ("iid", "e1-b10"): 0.1,
       ("iid", "e5-b50"): 0.1, ("iid", "e5-b10"): 0.05,
       ("shards", "fedsgd"): 0.1, ("shards", "e1-b50"): 0.1, ("shards", "e1-b10"): 0.05,
       ("shards", "e5-b50"): 0.05, ("shards", "e5-b10"): 0.02}
# The paper's Table 2, MNIST, rounds to its target (2NN: 97 %, CNN: 99 %) and the speed-up
# over FedSGD: (IID, non-IID). Its 2NN rows have E in {1, 10, 20}, its CNN rows E in
# {1, 5, 20}: E = 5 is quoted from the CNN.
PAPER = {"fedsgd": ("2NN", (1468, 1817)), "e1-b50": ("2NN", (144, 1183)),
         "e1-b10": ("2NN", (92, 831)), "e5-b50": ("CNN", (29, 334)),
         "e5-b10": ("CNN", (20, 229))}
PAPER_FEDSGD = {"2NN": (1468, 1817), "CNN": (626, 483)}


def parse_list(text: str, known: Any, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in known]
    if not items or unknown or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{what}: a comma-separated list of distinct "
                                         f"names of {', '.join(known)} (got {text!r})")
    return items


def parse_targets(text: str) -> list[float]:
    try:
        targets = sorted({float(item) for item in text.split(",") if item.strip()})
    except ValueError:
        targets = []
    if not targets or not all(0.0 < t < 1.0 for t in targets):
        raise argparse.ArgumentTypeError(f"targets: accuracies in (0, 1), e.g. 0.93,0.95 "
                                         f"(got {text!r})")
    return targets


def parse_eta(text: str) -> tuple[tuple[str, str], float]:
    """'shards:e1-b10=0.05' -> (('shards', 'e1-b10'), 0.05)."""
    key, _, value = text.partition("=")
    partition, _, config = key.partition(":")
    try:
        eta = float(value)
    except ValueError:
        eta = -1.0
    if partition not in PARTITIONS or config not in CONFIGS or not eta > 0:
        raise argparse.ArgumentTypeError(f"--eta: PARTITION:CONFIG=RATE, e.g. "
                                         f"shards:e1-b10=0.05 (got {text!r})")
    return (partition, config), eta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a check of the bench: FedSGD on the IID split and FedAvg "
                        "E = 5, B = 10 on both, 2 rounds, target 0.5; results not written "
                        "unless --out")
    parser.add_argument("--configs", type=lambda t: parse_list(t, CONFIGS, "--configs"),
                        default=None, help=f"rows to run (default all: {', '.join(CONFIGS)})")
    parser.add_argument("--partitions", default=None,
                        type=lambda t: parse_list(t, PARTITIONS, "--partitions"),
                        help="iid, shards or both (default both)")
    parser.add_argument("--targets", type=parse_targets, default=None,
                        help="test accuracies to count rounds to; a run stops at the "
                        "highest (default 0.9,0.93)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="round budget of a FedAvg run (default 300)")
    parser.add_argument("--fedsgd-rounds", type=int, default=None,
                        help="round budget of a FedSGD run (default 500)")
    parser.add_argument("--eta", type=parse_eta, action="append", default=[],
                        metavar="PARTITION:CONFIG=RATE",
                        help="a local learning rate other than the bench's, e.g. "
                        "shards:e1-b10=0.05 (repeatable)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results JSON (default {RESULTS.relative_to(REPO)}; "
                        "--quick: none)")
    args = parser.parse_args(argv)
    quick = args.quick
    if quick and args.configs is None and args.partitions is None:
        args.runs = [list(pair) for pair in QUICK_RUNS]
    else:
        args.runs = [[p, c] for p in args.partitions or PARTITIONS
                     for c in args.configs or CONFIGS]
    args.configs = [c for c in CONFIGS if any(c == run[1] for run in args.runs)]
    args.partitions = [p for p in PARTITIONS if any(p == run[0] for run in args.runs)]
    args.targets = args.targets or ([0.5] if quick else [0.9, 0.93])
    args.rounds = args.rounds if args.rounds is not None else (2 if quick else 300)
    args.fedsgd_rounds = args.fedsgd_rounds if args.fedsgd_rounds is not None else \
        (2 if quick else 500)
    if args.rounds < 1 or args.fedsgd_rounds < 1:
        parser.error("round budgets must be at least 1")
    args.etas = ETA | dict(args.eta)
    if args.out is None and not quick:
        args.out = RESULTS
    return args


def client_sets(partition: str, name: str, eta: float, rounds: int) -> list[str]:
    """The client's --set items of one run."""
    config = CONFIGS[name]
    sets = ["run.algorithm=delta_avg", "run.model=mlp_classifier", "run.dataset=mnist",
            "data.format=mnist", 'run.model_args={"hidden": [200, 200]}',
            f"run.seed={SEED}", f"run.rounds={rounds}", "outputs.checkpoint_every=0",
            f"clients.count={CLIENTS}", f"clients.partition={partition}",
            f"clients.per_round={PER_ROUND}", f"delta_avg.epochs={config.epochs}",
            f"delta_avg.local_optimizer={config.optimizer}", f"delta_avg.eta={eta}"]
    if partition == "shards":
        sets.append("clients.shards_per_client=2")
    if config.batch is not None:
        sets.append(f"delta_avg.batch_size={config.batch}")
    return sets


def rounds_to(accuracies: list[float], target: float) -> int | None:
    """The first round (1-based) whose accuracy is at least ``target``; None if none."""
    return next((k + 1 for k, a in enumerate(accuracies) if a >= target), None)


def accuracies_of(rows: list[dict[str, Any]]) -> list[float]:
    """1 - validation error of each round, in round order (a round without an evaluation
    counts as 0)."""
    by_round = {row["round"]: row.get("validation_error", math.nan) for row in rows}
    errors = [by_round.get(r, math.nan) for r in range(1, max(by_round, default=0) + 1)]
    return [0.0 if math.isnan(error) else 1.0 - error for error in errors]


def run_one(cluster: FederatedCluster, partition: str, name: str, args: argparse.Namespace
            ) -> dict[str, Any]:
    eta = args.etas[(partition, name)]
    budget = args.fedsgd_rounds if name == "fedsgd" else args.rounds
    highest = max(args.targets)
    began = time.perf_counter()
    run = cluster.follow(client_sets(partition, name, eta, budget),
                         stop=lambda rows: max(accuracies_of(rows)) >= highest)
    if run.returncode not in (0, 3) or (run.returncode == 3 and not run.cancelled):
        raise RuntimeError(f"{partition} {name}: the client ended with {run.returncode}: "
                           f"{run.stderr}\n{cluster.logs()[-6000:]}")
    accuracies = accuracies_of(run.rows)
    partition_record = json.loads((run.run_dir / "partition.json").read_text())
    sizes = partition_record["sizes"]
    labels = [len(counts) for counts in partition_record["label_counts"]]
    trained = [row.get("clients_trained") for row in run.rows]
    return {"partition": partition, "config": name, "epochs": CONFIGS[name].epochs,
            "batch": CONFIGS[name].batch, "optimizer": CONFIGS[name].optimizer, "eta": eta,
            "budget": budget, "rounds_run": len(accuracies), "stopped_early": run.cancelled,
            "rounds_to": {f"{t:g}": rounds_to(accuracies, t) for t in args.targets},
            "best_accuracy": max(accuracies, default=0.0),
            "final_accuracy": accuracies[-1] if accuracies else 0.0,
            "u": CONFIGS[name].updates_per_round(sum(sizes) / len(sizes)),
            "client_sizes": [min(sizes), max(sizes)],
            "labels_per_client": [min(labels), max(labels)],
            "clients_trained_per_round": sorted(set(trained)),
            "seconds": time.perf_counter() - began, "run_id": run.run_dir.name,
            "accuracy": [round(a, 4) for a in accuracies]}


def speedup(rounds: int | None, base: int | None, base_budget: int) -> str:
    """FedSGD's rounds over this row's: '12.3x'; a FedSGD that missed its budget makes it
    a lower bound ('>= 3.3x'); a row that missed its own: '-'."""
    if rounds is None:
        return "-"
    if base is None:
        return f">= {base_budget / rounds:.1f}x"
    return f"{base / rounds:.1f}x"


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    found = {(run["partition"], run["config"]): run for run in runs}
    lines = []
    for target in args.targets:
        key = f"{target:g}"
        lines += [f"Rounds to {target:.0%} test accuracy (budget: FedSGD {args.fedsgd_rounds}, "
                  f"FedAvg {args.rounds}; '-': not reached), and the speed-up over FedSGD "
                  "on the same split; the paper's Table 2 (MNIST, 60,000 images, 600 per "
                  "client; 2NN to 97 %, CNN to 99 %) beside it", "",
                  "| row | E | B | u (ours / paper) | eta IID / non-IID | IID rounds | IID "
                  "speed-up | paper IID | non-IID rounds | non-IID speed-up | paper non-IID |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for name in args.configs:
            config, (model, paper) = CONFIGS[name], PAPER[name]
            cells = []
            for partition in PARTITIONS:
                run, base = found.get((partition, name)), found.get((partition, "fedsgd"))
                if run is None:
                    cells += ["", ""]
                    continue
                rounds = run["rounds_to"][key]
                shown = str(rounds) if rounds is not None else f"- (> {run['rounds_run']})"
                cells.append(shown)
                cells.append("1.0x" if name == "fedsgd" else "" if base is None else
                             speedup(rounds, base["rounds_to"][key], base["rounds_run"]))
            base_paper = PAPER_FEDSGD[model]
            paper_cells = [f"{paper[k]} ({base_paper[k] / paper[k]:.1f}x, {model})"
                           for k in range(2)]
            eta = " / ".join(f"{found[(p, name)]['eta']:g}" if (p, name) in found else ""
                             for p in PARTITIONS)
            batch = "all" if config.batch is None else str(config.batch)
            lines.append(f"| {'FedSGD' if name == 'fedsgd' else 'FedAvg'} | {config.epochs} | "
                         f"{batch} | {config.updates_per_round(80):g} / "
                         f"{config.updates_per_round(600):g} | {eta} | {cells[0]} | {cells[1]} "
                         f"| {paper_cells[0]} | {cells[2]} | {cells[3]} | {paper_cells[1]} |")
        lines.append("")
    lines += ["| split | row | rounds run | best accuracy | final accuracy | seconds |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for run in runs:
        lines.append(f"| {run['partition']} | {run['config']} | {run['rounds_run']} | "
                     f"{run['best_accuracy']:.4f} | {run['final_accuracy']:.4f} | "
                     f"{run['seconds']:.0f} |")
    return "\n".join(lines)


def findings(runs: list[dict[str, Any]], targets: list[float]) -> dict[str, Any]:
    """The paper's two findings at each target: every FedAvg row needs fewer rounds than
    FedSGD on the same split, and every row needs more rounds on the non-IID split than
    on the IID one. True or False where the runs decide it; None where a run that would
    decide it is missing, or missed its target within a budget that leaves it open."""
    found = {(run["partition"], run["config"]): run for run in runs}

    def fewer(a: dict[str, Any], b: dict[str, Any], key: str) -> bool | None:
        """Did run ``a`` reach the target in fewer rounds than run ``b``?"""
        ra, rb = a["rounds_to"][key], b["rounds_to"][key]
        if ra is not None and (rb is not None or ra <= b["rounds_run"]):
            return rb is None or ra < rb
        if rb is not None and a["rounds_run"] >= rb:
            return False  # a was still short of it at b's count
        return None

    def all_of(verdicts: list[bool | None]) -> bool | None:
        if not verdicts or None in verdicts and False not in verdicts:
            return None
        return all(verdicts)

    out: dict[str, Any] = {}
    for target in targets:
        key = f"{target:g}"
        faster = [fewer(found[(p, c)], found[(p, "fedsgd")], key)
                  for p in PARTITIONS for c in CONFIGS if c != "fedsgd"
                  if (p, c) in found and (p, "fedsgd") in found]
        slower = [fewer(found[("iid", c)], found[("shards", c)], key)
                  for c in CONFIGS if ("shards", c) in found and ("iid", c) in found]
        out[key] = {"fedavg_fewer_rounds_than_fedsgd": all_of(faster),
                    "non_iid_more_rounds_than_iid": all_of(slower)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # only for its version, after the arguments are checked

    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-fedavg-") as tmp, \
            FederatedCluster(Path(tmp), CLIENTS, nodes=2) as cluster:
        for partition, name in args.runs:
            run = run_one(cluster, partition, name, args)
            print(f"{partition} {name}: eta {run['eta']}, rounds to {run['rounds_to']}, "
                  f"best {run['best_accuracy']:.4f} in {run['rounds_run']} rounds, "
                  f"{run['seconds']:.0f} s", file=sys.stderr, flush=True)
            runs.append(run)
    load_after = os.getloadavg()
    print(report(runs, args))
    result = findings(runs, args.targets)
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {key: value for key, value in vars(args).items()
                    if key not in ("eta", "etas", "out")}
        args.out.write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": load_after, "settings": settings,
             "etas": {f"{p}:{c}": v for (p, c), v in args.etas.items()},
             "clients": CLIENTS, "per_round": PER_ROUND, "training_images": 8000,
             "held_out_images": 2000, "paper_table2": {k: {"model": m, "iid": v[0],
                                                          "non_iid": v[1]}
                                                      for k, (m, v) in PAPER.items()},
             "findings": result, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
