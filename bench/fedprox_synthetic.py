"""FedProx against FedAvg on Synthetic(alpha, beta) with stragglers (Li et al. 2020, Fig. 1).

Li et al., "Federated Optimization in Heterogeneous Networks" (arXiv 1812.06127), Figure 1:
30 devices with their own Synthetic(alpha, beta) data, 10 sampled per round, multinomial
logistic regression, E = 20 local epochs of SGD (batch 10, lr 0.01). In each round a share
of the sampled devices (0 %, 50 %, 90 %) are stragglers that manage only a number of
epochs drawn uniformly in 1..E. Three methods:

* FedAvg: mu = 0, the stragglers' results dropped;
* FedProx, mu = 0: the stragglers' partial work kept (the paper's middle curve);
* FedProx, mu = 1: partial work kept, proximal term mu/2 ||w - w_round||^2.

Everything runs through real processes: 2 compute nodes and a coordinator on 127.0.0.1
(``--max-update-norm 0``: no update-norm guard, as the paper's server), each allowing the
plug-ins of bench/fedprox_plugins.py (the data set, the one-client-per-
device partitioner, the model and FedProx with stragglers), ended by their PIDs.

The loss reported is the global model's training loss over all 30 devices' training
examples (the weighted objective f(w) Li et al. plot), scored by the coordinator after
every round: the data set plug-in's validation part is its training part
(``score: train``). Each device's last 20 % is held out; the final model's held-out
accuracy is scored here from the run's model file. Stability: the standard deviation and
the mean absolute round-to-round change of the loss over the last ``--last`` rounds.

    python bench/fedprox_synthetic.py                    # Synthetic(1,1), 40 rounds
    python bench/fedprox_synthetic.py --synthetic 0.5,0.5 --rounds 40
    python bench/fedprox_synthetic.py --quick            # 2 rounds of 1 epoch, a check
    python bench/fedprox_synthetic.py --replot A.json B.json   # one picture of both
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fedprox_plugins as plugins  # noqa: E402

from devtools.machine import describe  # noqa: E402
from devtools.throughput import LocalCluster  # noqa: E402

RESULTS = REPO / "bench" / "results" / "fedprox_synthetic.json"
PLOT = REPO / "docs" / "images" / "fedprox_synthetic.png"
PLUGIN_ARGS = ("--plugins", "fedprox_plugins", "--plugin-dir", str(REPO / "bench"))
# The paper's server averages whatever comes: no update-norm guard, which would refuse a
# client's full update when the round's other results are dropped stragglers' single steps.
COORDINATOR_ARGS = (*PLUGIN_ARGS, "--no-speculation", "--max-update-norm", "0")
DEVICES, PER_ROUND = 30, 10


@dataclass(frozen=True)
class Method:
    key: str
    label: str
    mu: float
    drop: bool


METHODS = (Method("fedavg", "FedAvg (drops stragglers)", 0.0, True),
           Method("fedprox_mu0", "FedProx, mu = 0", 0.0, False),
           Method("fedprox_mu1", "FedProx, mu = 1", 1.0, False))
QUICK_METHODS = ("fedavg", "fedprox_mu1")


# --------------------------------------------------------------------------- arguments
def parse_pair(text: str) -> tuple[float, float]:
    try:
        alpha, beta = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ALPHA,BETA, got {text!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in (alpha, beta)):
        raise argparse.ArgumentTypeError(f"alpha and beta must be >= 0, got {text!r}")
    return alpha, beta


def parse_shares(text: str) -> list[float]:
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shares such as 0,0.5,0.9, got "
                                         f"{text!r}") from None
    if not shares or len(set(shares)) != len(shares) or not all(0 <= s <= 1 for s in shares):
        raise argparse.ArgumentTypeError(f"shares must differ and lie in [0, 1], got {text!r}")
    return shares


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic", type=parse_pair, action="append", metavar="A,B",
                        help="Synthetic(alpha, beta) to run, repeatable (default 1,1)")
    parser.add_argument("--stragglers", type=parse_shares, default=None,
                        help="straggler shares of each round's clients (default 0,0.5,0.9)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default 40)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="E, local epochs of a full client (default 20)")
    parser.add_argument("--batch", type=int, default=10, help="local batch size (default 10)")
    parser.add_argument("--lr", type=float, default=0.01, help="local SGD rate (default 0.01)")
    parser.add_argument("--mu", type=float, default=1.0,
                        help="FedProx's mu of the third method (default 1)")
    parser.add_argument("--seed", type=int, default=1,
                        help="run seed: sampling, stragglers, shuffles (default 1)")
    parser.add_argument("--data-seed", type=int, default=0,
                        help="seed of the synthetic devices (default 0)")
    parser.add_argument("--last", type=int, default=10,
                        help="rounds the stability figures cover (default 10)")
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds of 1 epoch, 50 %% stragglers, FedAvg and FedProx "
                             "mu = 1: a check of the bench (no files unless asked)")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"results file (default {RESULTS.relative_to(REPO)}; "
                             f"--quick: none)")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"picture (default {PLOT.relative_to(REPO)}; --quick: none)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the processes run (default a temporary folder)")
    parser.add_argument("--replot", type=Path, nargs="+", default=None, metavar="JSON",
                        help="run nothing: the tables and one picture of these results "
                             "files (e.g. one per Synthetic(alpha, beta)), in this order")
    args = parser.parse_args(argv)
    quick = args.quick
    args.synthetic = args.synthetic or [(1.0, 1.0)]
    args.stragglers = args.stragglers or ([0.5] if quick else [0.0, 0.5, 0.9])
    if args.rounds is None:
        args.rounds = 2 if quick else 40
    if args.epochs is None:
        args.epochs = 1 if quick else 20
    args.methods = list(QUICK_METHODS) if quick else [m.key for m in METHODS]
    if not quick:
        args.json = args.json or RESULTS
        args.plot = args.plot or PLOT
    for name in ("rounds", "epochs", "batch", "last"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not (args.lr > 0 and args.mu >= 0):
        parser.error("--lr must be positive and --mu at least 0")
    return args


# ------------------------------------------------------------------------------- runs
def method_of(key: str) -> Method:
    return next(m for m in METHODS if m.key == key)


def run_config(args: argparse.Namespace, pair: tuple[float, float], share: float,
               method: Method) -> dict[str, Any]:
    """The run's config (the client reads it as YAML; JSON is YAML)."""
    mu = args.mu if method.mu else 0.0
    return {
        "run": {"algorithm": "fedprox_plugins:StragglerFedProx",
                "model": "fedprox_plugins:Multinomial",
                "dataset": "fedprox_plugins:synthetic_devices",
                "rounds": args.rounds, "seed": args.seed,
                "algorithm_args": {"mu": mu, "stragglers": share,
                                   "drop_stragglers": method.drop, "epochs": args.epochs,
                                   "local_optimizer": "sgd", "eta": args.lr,
                                   "batch_size": args.batch}},
        "data": {"args": {"alpha": pair[0], "beta": pair[1], "seed": args.data_seed,
                          "score": "train"}},
        "clients": {"count": DEVICES, "partition": "fedprox_plugins:device_parts",
                    "per_round": PER_ROUND},
        "outputs": {"checkpoint_every": 0, "eval_every": 1},
    }


def runs_of(args: argparse.Namespace) -> list[tuple[float, str]]:
    """(share, method) to run; with no stragglers FedProx mu = 0 is FedAvg: run once."""
    return [(share, key) for share in args.stragglers for key in args.methods
            if not (share == 0 and key == "fedprox_mu0" and "fedavg" in args.methods)]


def check_sampling(run_dir: Path, config: dict[str, Any]) -> None:
    """The clients the run asked each round are those the plug-in's replica of the
    sampling names (so the nodes' and the coordinator's stragglers are the run's)."""
    asked: dict[int, set[str]] = {}
    for line in (run_dir / "clients.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") != "eval":  # a federated evaluation's line is no training unit
            asked.setdefault(row["round"], set()).add(row["client"])
    checked = {"seed": config["run"]["seed"], "clients": config["clients"]}
    for round_index, clients in asked.items():
        expected = set(plugins.round_clients(checked, round_index))
        if clients != expected:
            raise RuntimeError(f"round {round_index} asked {sorted(clients)}, the replica "
                               f"samples {sorted(expected)}")


def held_out_scores(model_file: Path, pair: tuple[float, float], data_seed: int
                    ) -> dict[str, float]:
    """The final model's loss and accuracy on the held-out 20 % of every device, and its
    training loss (a check of the run's last figure)."""
    with np.load(model_file) as saved:
        weight = saved["linear.weight"].astype(np.float64)
        bias = saved["linear.bias"].astype(np.float64)
    train, held = plugins.all_devices(pair[0], pair[1], data_seed)
    scores = {}
    for name, part in (("train", train), ("held_out", held)):
        logits = part.inputs.numpy().astype(np.float64) @ weight.T + bias
        labels = part.targets.numpy()
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        scores[f"{name}_loss"] = float(-log_p[np.arange(len(labels)), labels].mean())
        scores[f"{name}_accuracy"] = float((logits.argmax(axis=1) == labels).mean())
    return scores


def stability(losses: Sequence[float], last: int) -> dict[str, float]:
    """Over the last ``last`` rounds: mean, standard deviation, mean |change| between
    rounds; and the largest rise of the loss from one round to the next over the whole run
    (0 when it never rose)."""
    tail = np.asarray(losses[-last:], dtype=np.float64)
    changes = np.diff(np.asarray(losses, dtype=np.float64))
    return {"last_mean": float(tail.mean()), "last_std": float(tail.std()),
            "last_mean_abs_change": float(np.abs(np.diff(tail)).mean()) if len(tail) > 1
            else 0.0,
            "largest_rise": max(0.0, float(changes.max())) if len(changes) else 0.0}


def one_run(cluster: LocalCluster, args: argparse.Namespace, pair: tuple[float, float],
            share: float, method: Method, workdir: Path) -> dict[str, Any]:
    config = run_config(args, pair, share, method)
    path = workdir / f"run_{pair[0]}_{pair[1]}_{share}_{method.key}.yaml"
    path.write_text(json.dumps(config))
    began = time.perf_counter()
    result = cluster.train(["--config", str(path)], timeout=3600).result
    seconds = time.perf_counter() - began
    run_dir = Path(result["coordinator_run_dir"])
    check_sampling(run_dir, config)
    history = result["history"]
    losses = [row["validation_loss"] for row in history]
    return {"synthetic": list(pair), "stragglers": share, "method": method.key,
            "label": method.label, "mu": config["run"]["algorithm_args"]["mu"],
            "drop_stragglers": method.drop, "rounds": len(history),
            "global_train_loss": losses,
            "global_train_error": [row["validation_error"] for row in history],
            "mean_local_loss": [row["train_loss"] for row in history],
            "final": held_out_scores(run_dir / "model.npz", pair, args.data_seed),
            "stability": stability(losses, args.last), "seconds": seconds}


def loss_at(run: dict[str, Any], round_index: int) -> float:
    losses = run["global_train_loss"]
    return losses[min(round_index, len(losses)) - 1]


# ----------------------------------------------------------------------------- report
def checkpoints(rounds: int) -> list[int]:
    marks = [1] + [r for r in (5, 10, 20, 40, 80, 100, 150, 200) if r < rounds] + [rounds]
    return sorted(set(marks))


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    marks = checkpoints(args.rounds)
    lines = []
    for pair in args.synthetic:
        lines += [f"Synthetic({pair[0]:g},{pair[1]:g}): global training loss (all 30 "
                  f"devices' training examples) after round", "",
                  "| stragglers | method | " + " | ".join(f"{r}" for r in marks)
                  + f" | last {args.last}: mean | std | mean abs change | largest rise "
                    "| held-out accuracy |",
                  "| ---: | --- | " + " | ".join("---:" for _ in marks)
                  + " | ---: | ---: | ---: | ---: | ---: |"]
        for run in runs:
            if tuple(run["synthetic"]) != pair:
                continue
            s = run["stability"]
            lines.append(f"| {run['stragglers']:.0%} | {run['label']} | "
                         + " | ".join(f"{loss_at(run, r):.4f}" for r in marks)
                         + f" | {s['last_mean']:.4f} | {s['last_std']:.4f} | "
                           f"{s['last_mean_abs_change']:.4f} | {s['largest_rise']:.4f} | "
                           f"{run['final']['held_out_accuracy']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs, shares = args.synthetic, args.stragglers
    figure, axes = plt.subplots(len(pairs), len(shares), squeeze=False,
                                figsize=(4.2 * len(shares), 3.4 * len(pairs)), sharey="row")
    styles = {"fedavg": ("tab:green", "-"), "fedprox_mu0": ("tab:blue", "--"),
              "fedprox_mu1": ("tab:red", "-")}
    for row, pair in enumerate(pairs):
        for column, share in enumerate(shares):
            ax = axes[row][column]
            for run in runs:
                if tuple(run["synthetic"]) != pair or run["stragglers"] != share:
                    continue
                colour, style = styles[run["method"]]
                losses = run["global_train_loss"]
                label = run["label"] if not (share == 0 and run["method"] == "fedavg") \
                    else "FedAvg = FedProx, mu = 0"
                ax.plot(range(1, len(losses) + 1), losses, style, color=colour, label=label)
            ax.set_title(f"Synthetic({pair[0]:g},{pair[1]:g}), {share:.0%} stragglers")
            ax.set_xlabel("round")
            if column == 0:
                ax.set_ylabel("training loss")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ------------------------------------------------------------------------------- main
def replot(files: Sequence[Path], plot_path: Path | None) -> int:
    """The report and one picture of results files written by earlier runs."""
    runs, pairs, shares, rounds, last = [], [], [], 1, 10
    for path in files:
        saved = json.loads(path.read_text())
        last = saved["settings"]["last"]
        for run in saved["runs"]:
            runs.append(run)
            pair = tuple(run["synthetic"])
            if pair not in pairs:
                pairs.append(pair)
            if run["stragglers"] not in shares:
                shares.append(run["stragglers"])
            rounds = max(rounds, run["rounds"])
    view = argparse.Namespace(synthetic=pairs, stragglers=sorted(shares), rounds=rounds,
                              last=last)
    print(report(runs, view))
    if plot_path is not None:
        plot(runs, view, plot_path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot, args.plot)
    machine = describe()
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fedprox-") as tmp:
        workdir = args.workdir or Path(tmp)
        with LocalCluster(2, workdir, PLUGIN_ARGS, COORDINATOR_ARGS) as cluster:
            for pair in args.synthetic:
                for share, key in runs_of(args):
                    run = one_run(cluster, args, pair, share, method_of(key), workdir)
                    runs.append(run)
                    print(f"Synthetic({pair[0]:g},{pair[1]:g}) {share:.0%} {key}: loss "
                          f"{run['global_train_loss'][-1]:.4f} in {run['seconds']:.0f} s",
                          file=sys.stderr, flush=True)
    print(report(runs, args))
    if args.plot is not None:
        plot(runs, args, args.plot)
    if args.json is not None:
        settings = {key: (str(value) if isinstance(value, Path) else value)
                    for key, value in vars(args).items()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": os.getloadavg(), "settings": settings,
             "loss": "global model's training loss over all devices' training examples, "
                     "scored by the coordinator after each round",
             "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
