"""What client-level differential privacy costs: validation accuracy against epsilon.

DP-FedAvg (docs/privacy.md) on the letters data: ``mlp_classifier`` trained by
``delta_avg`` (local SGD) over 1,000 clients dealt by a non-IID rule, Poisson-sampled each
round, for target epsilons 1, 3 and 8 at delta 1e-4 after R rounds, and without privacy.
For each target the noise multiplier z is found by a binary search over z with the
project's own accounting (training/privacy/accounting.py ``epsilon``, dp-accounting's RDP
accountant over R Poisson-sampled Gaussian rounds), so that R rounds spend the target.

1. **Through real processes**: a coordinator and 2 compute nodes on 127.0.0.1, the first
   holding clients 0-499, the second 500-999 (devtools/federated_cluster.py), serve the
   runs one after another; each run's final validation accuracy, the epsilon it reported
   after its last round, and its wall time (the client's start to its end).
2. **In one process**: the same DP-FedAvg computed here from the same seed and, for a
   private run, the noise key its coordinator made, read from the run's checkpoint
   (coordinator/checkpoint.py ``noise_key``): each round's clients drawn by the Poisson
   rule under that key (the seed's without privacy; checked against the run's
   clients.jsonl), trained by delta_avg's node half (devtools/fedavg_replay.py), their
   updates through training/privacy/mechanism.py ``private_mean`` (same clip, z, key and
   round, so the same noise) and the server optimizer; the final accuracy and the largest
   absolute difference between its weights and the run's model.npz.
3. **Epsilon cross-checks**: for each (z, q, R), dp-accounting's RDP and PLD accountants
   called directly, and Opacus's RDP accountant (``opacus.accountants.RDPAccountant``),
   run in a bench-only virtual environment when it exists (bench/.venvs/opacus, made by
   ``--make-opacus-venv``: Opacus installed without its dependencies beside the project's
   own torch; it never enters the project's requirements).

Every child runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/privacy_costs.py --make-opacus-venv   # once: bench/.venvs/opacus
    python bench/privacy_costs.py                      # about 10 minutes on 2 cores
    python bench/privacy_costs.py --quick              # a check of the bench, about 40 s
"""

from __future__ import annotations

import argparse
import json
import os
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.fedavg_replay import LETTERS, algorithm_for, run_config, train_round  # noqa: E402
from devtools.federated_cluster import FederatedCluster  # noqa: E402
from devtools.machine import describe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "privacy_costs.json"
OPACUS_VENV = REPO / "bench" / ".venvs" / "opacus"
OPACUS_VERSION = "1.6.0"
CLIENTS, NODES, SEED, DELTA = 1000, 2, 1, 1e-4
TARGETS = (1.0, 3.0, 8.0)
# dirichlet (alpha 0.5, even 3) cannot give each of 1,000 clients its 10 examples of the
# 16,500 rows: label skew by classes instead, 4 of the 26 letters per client
PARTITION = ("clients.partition=classes", "clients.classes_per_client=4")
DEFAULTS = {"rounds": 100, "per_round": 100, "clip": 0.5, "eta": 0.05, "epochs": 2}
QUICK = {"rounds": 3, "per_round": 20, "targets": (8.0,)}
WEIGHT_TOLERANCE = 1e-5  # float32 weights, float64 sums: equal up to rounding


@dataclass(frozen=True)
class Setting:
    """One row: a target epsilon (None: no privacy) and the z that spends it in R rounds."""

    target: float | None
    z: float

    @property
    def name(self) -> str:
        return "non-private" if self.target is None else f"epsilon {self.target:g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Opacus's accountant runs only when bench/.venvs/opacus exists: make it once "
        "with --make-opacus-venv (a venv of this interpreter with --system-site-packages, a "
        "link to this interpreter's site-packages for torch and numpy, and pip install "
        f"--no-deps opacus=={OPACUS_VERSION}; no other torch is downloaded).")
    parser.add_argument("--quick", action="store_true",
                        help="a check of the bench: target epsilon 8 and no privacy, "
                        f"{QUICK['rounds']} rounds of {QUICK['per_round']} clients expected; "
                        "results not written unless --out")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"R, rounds of every run (default {DEFAULTS['rounds']})")
    parser.add_argument("--per-round", type=int, default=None,
                        help="clients expected per round, q x 1,000 (default "
                        f"{DEFAULTS['per_round']})")
    parser.add_argument("--clip", type=float, default=DEFAULTS["clip"],
                        help=f"privacy.clip (default {DEFAULTS['clip']})")
    parser.add_argument("--eta", type=float, default=DEFAULTS["eta"],
                        help=f"the clients' SGD rate (default {DEFAULTS['eta']})")
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"],
                        help=f"local epochs per round (default {DEFAULTS['epochs']})")
    parser.add_argument("--targets", type=parse_targets, default=None,
                        help="target epsilons, e.g. 1,3,8 (default; --quick: 8)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results JSON (default {RESULTS.relative_to(REPO)}; "
                        "--quick: none)")
    parser.add_argument("--opacus-venv", type=Path, default=OPACUS_VENV,
                        help="the venv Opacus's accountant runs in (default "
                        f"{OPACUS_VENV.relative_to(REPO)})")
    parser.add_argument("--make-opacus-venv", action="store_true",
                        help="create --opacus-venv with Opacus and stop")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (QUICK["rounds"] if args.quick else DEFAULTS["rounds"])
    args.per_round = args.per_round or \
        (QUICK["per_round"] if args.quick else DEFAULTS["per_round"])
    args.targets = args.targets or list(QUICK["targets"] if args.quick else TARGETS)
    if args.rounds < 1 or not 1 <= args.per_round < CLIENTS or args.clip <= 0:
        parser.error(f"--rounds must be >= 1, --per-round in [1, {CLIENTS}), --clip > 0")
    if args.out is None and not args.quick:
        args.out = RESULTS
    return args


def parse_targets(text: str) -> list[float]:
    try:
        targets = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        targets = []
    if not targets or min(targets) <= 0:
        raise argparse.ArgumentTypeError(f"--targets: positive epsilons, e.g. 1,3,8 "
                                         f"(got {text!r})")
    return targets


def client_sets(args: argparse.Namespace, setting: Setting) -> list[str]:
    """The client's ``--set`` items of one run."""
    sets = ["run.algorithm=delta_avg", "run.model=mlp_classifier", "run.dataset=letters",
            "data.format=letters", f"run.seed={SEED}", f"run.rounds={args.rounds}",
            "outputs.checkpoint_every=1", f"clients.count={CLIENTS}", *PARTITION,
            f"clients.per_round={args.per_round}", "clients.sampling=poisson",
            f"delta_avg.epochs={args.epochs}", "delta_avg.local_optimizer=sgd",
            "delta_avg.batch_size=8", f"delta_avg.eta={args.eta}"]
    if setting.target is not None:
        sets += [f"privacy.clip={args.clip}", f"privacy.noise_multiplier={setting.z!r}",
                 f"privacy.delta={DELTA}"]
    return sets


# ------------------------------------------------------------------------ accounting
def sampling_of(args: argparse.Namespace) -> Any:
    """The run's `Sampling` (Poisson, q = per_round / clients holding an example), as the
    coordinator computes it from the partition."""
    algorithm = algorithm_for(run_config(client_sets(args, Setting(8.0, 1.0))))
    return algorithm.privacy_sampling()


def project_epsilon(z: float, sampling: Any, rounds: int) -> float:
    """Epsilon after ``rounds`` rounds of noise multiplier ``z``, by the project's
    accounting function (dp-accounting's RDP accountant)."""
    from thrift_trainer.training.privacy import accounting
    from thrift_trainer.training.schema import PrivacySettings

    return accounting.epsilon(PrivacySettings(clip=1.0, noise_multiplier=z, delta=DELTA),
                              sampling, rounds)


def noise_for(target: float, sampling: Any, rounds: int, tolerance: float = 1e-5) -> float:
    """The smallest z (to ``tolerance``, relative) whose ``rounds`` rounds spend at most
    ``target``: epsilon falls as z grows, so a bracket doubled until it holds, then halved."""
    low, high = 0.0, 1.0
    while project_epsilon(high, sampling, rounds) > target:
        low, high = high, 2 * high
    while high - low > tolerance * high:
        middle = (low + high) / 2
        if project_epsilon(middle, sampling, rounds) > target:
            low = middle
        else:
            high = middle
    return high


def dp_accounting_epsilons(z: float, q: float, rounds: int) -> dict[str, float]:
    """dp-accounting called directly: R Poisson-sampled Gaussian rounds (add-or-remove-one),
    by its RDP and PLD accountants, at DELTA."""
    import dp_accounting
    from dp_accounting import pld, rdp

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
    found = {}
    for name, accountant in (("rdp", rdp.RdpAccountant()), ("pld", pld.PLDAccountant())):
        accountant.compose(event)
        found[name] = float(accountant.get_epsilon(DELTA))
    return found


OPACUS_SCRIPT = """
import json, sys
from opacus.accountants import RDPAccountant
import opacus
answers = []
for case in json.load(sys.stdin):
    accountant = RDPAccountant()
    for _ in range(case["rounds"]):
        accountant.step(noise_multiplier=case["z"], sample_rate=case["q"])
    answers.append(accountant.get_epsilon(delta=case["delta"]))
print(json.dumps({"version": opacus.__version__, "epsilons": answers}))
"""


def opacus_epsilons(venv: Path, cases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Opacus's RDP accountant's epsilon for each case (z, q, rounds, delta), computed by
    the venv's interpreter; None when the venv does not exist."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", OPACUS_SCRIPT], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Opacus's accountant failed in {venv}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def make_opacus_venv(venv: Path) -> None:
    """A venv for Opacus's accountant: this interpreter's, with --system-site-packages,
    a .pth naming this interpreter's site-packages (torch, numpy, scipy: a venv of a venv
    sees only the base interpreter's), and Opacus installed with --no-deps, so that no
    other torch is downloaded."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (Path(own) / "project_site_packages.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps",
                    f"opacus=={OPACUS_VERSION}"], check=True)
    check = opacus_epsilons(venv, [{"z": 1.0, "q": 0.01, "rounds": 10, "delta": DELTA}])
    print(f"{venv}: Opacus {check['version']}, epsilon {check['epsilons'][0]:.4g} for "
          "z 1, q 0.01, 10 steps", file=sys.stderr)


# ------------------------------------------------------------------- one process
def held_clients(run_dir: Path) -> list[str]:
    """The clients holding at least one example, from the run's partition.json."""
    sizes = json.loads((run_dir / "partition.json").read_text())["sizes"]
    return [f"client{k}" for k, size in enumerate(sizes) if size]


def draws(args: argparse.Namespace, held: list[str],
          key: bytes | None) -> dict[int, list[str]]:
    """Each round's clients by the Poisson rule, as the coordinator draws them: under a
    private run's noise ``key``, by the seed without one."""
    from thrift_trainer.training.clients.settings import ClientsSettings

    settings = ClientsSettings(count=CLIENTS, per_round=args.per_round, sampling="poisson")
    return {r: settings.sampled(r, SEED, held, key) for r in range(1, args.rounds + 1)}


def one_process(args: argparse.Namespace, setting: Setting, drawn: dict[int, list[str]],
                sampling: Any, key: bytes | None) -> tuple[dict[str, np.ndarray], float]:
    """DP-FedAvg of ``setting`` in this process: each round's drawn clients trained by
    delta_avg's node half, their updates through ``private_mean`` with the run's noise
    ``key`` (no privacy: the algorithm's example-weighted mean) and the server optimizer;
    the final weights and their validation accuracy."""
    from thrift_trainer.training.privacy.mechanism import private_mean

    config = run_config(client_sets(args, setting))
    algorithm = algorithm_for(config)
    weights = algorithm.initial_weights()
    for r in range(1, args.rounds + 1):
        results = train_round(config, r, weights, [(name, LETTERS) for name in drawn[r]])
        if setting.target is None:
            weights = algorithm.aggregate(r, weights, results, [])
            continue
        mean = private_mean([result.update for result in results], weights, args.clip,
                            setting.z, sampling.expected, key, r)
        weights = algorithm.apply(weights, mean)
    return weights, 1.0 - algorithm.evaluate(weights).validation_error


# ------------------------------------------------------------------ distributed
def distributed(cluster: FederatedCluster, args: argparse.Namespace,
                setting: Setting) -> tuple[dict[str, Any], Path]:
    """One run through the cluster: its figures and its run folder."""
    run = cluster.follow(client_sets(args, setting), timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{setting.name}: the client ended with {run.returncode}: "
                           f"{run.stderr}\n{cluster.logs()[-6000:]}")
    result = json.loads(run.stdout)
    lines = [json.loads(line) for line in
             (run.run_dir / "clients.jsonl").read_text().splitlines()]
    trained = {r: sorted((line["client"] for line in lines if line["round"] == r
                          and "node" in line), key=lambda name: int(name[6:]))
               for r in range(1, args.rounds + 1)}
    return {"run_id": result["run_id"], "rounds": len(run.rows),
            "accuracy": 1.0 - result["validation_error"],
            "epsilon": run.rows[-1].get("epsilon") if run.rows else None,
            "epsilons": [row.get("epsilon") for row in run.rows],
            "wall_seconds": run.times["end"] - run.times["start"],
            "clients_trained": trained}, run.run_dir


def measure(cluster: FederatedCluster, args: argparse.Namespace, setting: Setting,
            sampling: Any) -> dict[str, Any]:
    """One row: the distributed run, its one-process twin and how far apart they are."""
    from thrift_trainer.coordinator.checkpoint import noise_key
    from thrift_trainer.training.outputs.model_file import load_model

    run, run_dir = distributed(cluster, args, setting)
    held = held_clients(run_dir)
    key = noise_key(run_dir) if setting.target is not None else None
    drawn = draws(args, held, key)
    started = time.monotonic()
    weights, accuracy = one_process(args, setting, drawn, sampling, key)
    seconds = time.monotonic() - started
    model, _ = load_model(run_dir / "model.npz")
    difference = max(float(np.max(np.abs(np.asarray(model[name], dtype=np.float64)
                                         - np.asarray(value, dtype=np.float64))))
                     for name, value in weights.items())
    trained = run.pop("clients_trained")
    return {"setting": setting.name, "target_epsilon": setting.target,
            "noise_multiplier": setting.z if setting.target is not None else 0.0,
            "clients_holding_data": len(held),
            "clients_per_round": [len(trained[r]) for r in sorted(trained)],
            "same_clients_as_the_draw": all(trained[r] == sorted(
                drawn[r], key=lambda name: int(name[6:])) for r in trained),
            **run, "one_process_accuracy": accuracy, "one_process_seconds": seconds,
            "max_abs_weight_difference": difference}


def cross_checks(rows: list[dict[str, Any]], args: argparse.Namespace, q: float
                 ) -> dict[str, Any]:
    """RDP, PLD (dp-accounting) and Opacus epsilons for each private row's (z, q, R)."""
    private = [row for row in rows if row["target_epsilon"] is not None]
    cases = [{"z": row["noise_multiplier"], "q": q, "rounds": args.rounds, "delta": DELTA}
             for row in private]
    opacus = opacus_epsilons(args.opacus_venv, cases) if cases else None
    checks = []
    for k, (row, case) in enumerate(zip(private, cases, strict=True)):
        found = dp_accounting_epsilons(case["z"], q, args.rounds)
        checks.append({**case, "target_epsilon": row["target_epsilon"],
                       "run_epsilon": row["epsilon"], "rdp": found["rdp"],
                       "pld": found["pld"],
                       "opacus_rdp": opacus["epsilons"][k] if opacus else None})
    venv = args.opacus_venv.resolve()
    venv = venv.relative_to(REPO) if venv.is_relative_to(REPO) else venv
    note = (f"Opacus {opacus['version']} in {venv}" if opacus else
            f"Opacus not run: {venv} does not exist (--make-opacus-venv)")
    return {"opacus": note, "cases": checks}


def report(result: dict[str, Any]) -> str:
    settings = result["settings"]
    lines = [f"{CLIENTS:,} clients ({' '.join(PARTITION)}), Poisson q = {result['q']:.4g} "
             f"({settings['per_round']} expected a round), R = {settings['rounds']}, clip "
             f"{settings['clip']}, delta {DELTA:g}", "",
             "| setting | z | accuracy (processes) | accuracy (one process) | epsilon reported "
             "| max abs weight difference | same clients | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for row in result["runs"]:
        epsilon = "inf" if row["epsilon"] is None else f"{row['epsilon']:.4f}"
        lines.append(f"| {row['setting']} | {row['noise_multiplier']:.4f} | "
                     f"{row['accuracy']:.4f} | {row['one_process_accuracy']:.4f} | {epsilon} | "
                     f"{row['max_abs_weight_difference']:.2e} | "
                     f"{'yes' if row['same_clients_as_the_draw'] else 'NO'} | "
                     f"{row['wall_seconds']:.1f} |")
    checks = result["epsilon_checks"]
    lines += ["", f"Epsilon after R rounds at delta {DELTA:g} ({checks['opacus']})", "",
              "| target | z | q | R | run (project, RDP) | dp-accounting RDP | "
              "dp-accounting PLD | Opacus RDP |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for case in checks["cases"]:
        opacus = "-" if case["opacus_rdp"] is None else f"{case['opacus_rdp']:.4f}"
        lines.append(f"| {case['target_epsilon']:g} | {case['z']:.4f} | {case['q']:.4g} | "
                     f"{case['rounds']} | {case['run_epsilon']:.4f} | {case['rdp']:.4f} | "
                     f"{case['pld']:.4f} | {opacus} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_opacus_venv:
        make_opacus_venv(args.opacus_venv)
        return 0
    import torch
    from absl import logging as absl_logging

    torch.set_num_threads(1)  # as the children (OMP_NUM_THREADS=1): 2 shared cores
    # the search tries small z, for which dp-accounting warns of RDP orders it leaves out
    absl_logging.set_verbosity(absl_logging.ERROR)
    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    started = time.monotonic()
    sampling = sampling_of(args)
    settings = [Setting(target, noise_for(target, sampling, args.rounds))
                for target in args.targets] + [Setting(None, 0.0)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-privacy-costs-") as tmp, \
            FederatedCluster(Path(tmp), CLIENTS, nodes=NODES) as cluster:
        for setting in settings:
            row = measure(cluster, args, setting, sampling)
            print(f"{setting.name}: z {row['noise_multiplier']:.4f}, accuracy "
                  f"{row['accuracy']:.4f} (one process {row['one_process_accuracy']:.4f}), "
                  f"epsilon {row['epsilon']}, {row['wall_seconds']:.1f} s, weights within "
                  f"{row['max_abs_weight_difference']:.2e}", file=sys.stderr, flush=True)
            rows.append(row)
    result = {"machine": machine, "load_average_before": load_before,
              "settings": {key: value for key, value in vars(args).items()
                           if key not in ("out", "opacus_venv", "make_opacus_venv")},
              "clients": CLIENTS, "partition": list(PARTITION), "delta": DELTA,
              "q": sampling.q, "expected_clients_per_round": sampling.expected,
              "noise_search": "binary search over z with training/privacy/accounting.py "
              "epsilon (dp-accounting RDP, Poisson-sampled Gaussian)",
              "weight_tolerance": WEIGHT_TOLERANCE, "runs": rows,
              "epsilon_checks": cross_checks(rows, args, sampling.q)}
    result["load_average_after"] = os.getloadavg()
    result["seconds"] = time.monotonic() - started
    print(report(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
