"""What secure aggregation costs: SecAgg+ rounds against plain FedAvg rounds, against
Flower's SecAgg+, and the protocol's primitives in-process.

1. **Through processes** (a coordinator and 2 compute nodes on 127.0.0.1, the first
   holding clients 0..C/2-1, the second the rest): the letters training part dealt IID to
   C = ``--count`` clients, ``mlp_classifier`` (16-64-26, 2,778 parameters) trained by
   FedAvg (one local epoch of SGD, batches of 8, eta 0.05), as docs/privacy.md's example,
   for each of 10 and 100 clients a round: a plain run, a secure run on the complete graph
   (``secure_aggregation.neighbours=0``) and one on a sparse graph (``--sparse``: 4
   neighbours at 10 clients, 10 at 100), 32 bits, the same seed, so that each round asks
   the same clients (checked against each run's clients.jsonl). Per round, from the run's
   metrics.jsonl: the coordinator's payload bytes (``bytes_down``, ``bytes_up``: every
   training call's frames at the transport, the secure steps' calls included) divided by
   parameters x clients trained; the round's wall seconds; and the secure steps' phases
   (``secure_keys``, ``secure_shares``, ``secure_train``, ``secure_unmask``,
   ``secure_sum``, inside ``units``). Medians over the rounds after the first; ratios
   secure / plain of the same cluster's runs.
2. **Flower's SecAgg+** (``SecAggPlusWorkflow`` with ``secaggplus_mod``, in Flower's
   simulation engine, Ray given 2 CPUs) on the same round sizes, numpy clients training the
   same shape (bench/flower_secagg_app.py), against Flower's plain FedAvg. Flower runs from
   its own virtual environment, ``--flower-venv`` (bench/.venvs/flower-secagg, ignored by
   git), which the full run creates and fills with ``flwr[simulation]`` (no torch).
   ``--flower-rounds`` rounds a run (the first its warm-up), but one only for the complete
   graph at 50 clients or more, whose pure-Python Shamir sharing takes minutes a round;
   and Flower's Shamir split and combine and its mask generator, in its own process.
   Settings mapped from ours: ``modulus_range`` = 2^bits; ``clipping_range`` =
   ``clip_range``; ``num_shares`` = neighbours + 1 (Flower counts the client's own
   share; the complete graph is 1.0, every sampled client); ``reconstruction_threshold``
   = ``threshold``; ``quantization_range`` = the largest power of 2 with clients x range <=
   2^bits (Flower quantises each client's value into [0, range) and sums them; ours
   scales by (2^(bits-1) - 1 - clients) / clip_range, signed).
3. **In-process** (training/secure_aggregation/): per client, making keys, the share phase
   (Shamir split and sealing per neighbour), the mask (quantising plus one ChaCha20
   expansion for the self mask and one per neighbour), the unmask answer; and the
   coordinator's ``unmask_sum`` (rebuilding every self-mask seed and expanding it), for
   10^5 and 10^6 parameters at 10 and 100 clients (complete graph; and 10 neighbours at
   100).

Every child runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/secure_aggregation.py            # about 12 minutes on 2 cores
    python bench/secure_aggregation.py --quick    # 10 clients a round, 3 rounds, small
                                                  # primitives, no Flower: under a minute
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

os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every child

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.federated_cluster import FederatedCluster  # noqa: E402
from devtools.machine import describe  # noqa: E402

RESULTS = REPO / "bench" / "results" / "secure_aggregation.json"
FLOWER_VENV = REPO / "bench" / ".venvs" / "flower-secagg"
FLOWER_SPEC = "flwr[simulation]"
DATA = REPO / "data" / "letters"
PER_ROUND = (10, 100)
SPARSE = {10: 4, 100: 10}  # neighbours of the sparse graph, by clients a round
COUNT, ROUNDS, NODES, BITS = 200, 6, 2, 32
SIZES = (100_000, 1_000_000)
FLOWER_STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage",
                 "unmask_stage")
SECURE_PHASES = ("secure_keys", "secure_shares", "secure_train", "secure_unmask",
                 "secure_sum")


# ------------------------------------------------------------------ arguments
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--quick", action="store_true",
                        help="10 clients a round of 40, 3 rounds, primitives at 10^4 "
                             "parameters, no Flower; results not written unless --out")
    parser.add_argument("--rounds", type=int, help=f"rounds per run (default {ROUNDS}; "
                        "quick 3); round 1 is the warm-up")
    parser.add_argument("--count", type=int, help=f"clients in all (default {COUNT}; "
                        "quick 40)")
    parser.add_argument("--per-round", type=_ints, help="clients per round, comma-separated "
                        "(default 10,100; quick 10)")
    parser.add_argument("--sizes", type=_ints, help="parameter counts of the in-process "
                        "primitives (default 100000,1000000; quick 10000)")
    parser.add_argument("--flower-venv", type=Path, default=FLOWER_VENV,
                        help="Flower's own virtual environment (default "
                             f"{FLOWER_VENV.relative_to(REPO)})")
    parser.add_argument("--flower-rounds", type=int, default=3,
                        help="Flower's rounds per run, the first its warm-up (default 3; "
                             "its complete graph at 50 clients or more: 1)")
    parser.add_argument("--no-flower", action="store_true",
                        help="leave Flower out (--quick always does)")
    parser.add_argument("--no-install", action="store_true",
                        help="never install Flower: leave it out when it is missing")
    parser.add_argument("--out", type=Path, help=f"results JSON (default "
                        f"{RESULTS.relative_to(REPO)}; quick: none)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds if args.rounds is not None else (3 if args.quick else ROUNDS)
    args.count = args.count if args.count is not None else (40 if args.quick else COUNT)
    args.per_round = args.per_round or ([10] if args.quick else list(PER_ROUND))
    args.sizes = args.sizes or ([10_000] if args.quick else list(SIZES))
    args.flower = not (args.quick or args.no_flower)
    if args.out is None and not args.quick:
        args.out = RESULTS
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is the warm-up)")
    if min(args.per_round) < 3 or max(args.per_round) > args.count:
        parser.error("--per-round values must lie in 3..--count")
    if args.count < NODES:
        parser.error(f"--count must be at least {NODES}")
    return args


def _ints(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"distinct positive integers, got {text!r}")
    return values


def sparse_neighbours(per_round: int) -> int:
    """The sparse graph's neighbours at ``per_round`` clients: 4 at 10, 10 at 100, else
    about a tenth (even, at least 2, fewer than the others)."""
    k = SPARSE.get(per_round, max(2, per_round // 10 // 2 * 2))
    return min(k, per_round - 2 if per_round % 2 == 0 else per_round - 1)


def variants(per_round: int) -> list[tuple[str, list[str]]]:
    """The runs of one round size: plain, secure on the complete graph, secure sparse."""
    secure = ["secure_aggregation.enabled=true", f"secure_aggregation.bits={BITS}"]
    return [("plain", []), ("secure-complete", secure + ["secure_aggregation.neighbours=0"]),
            (f"secure-k{sparse_neighbours(per_round)}",
             secure + [f"secure_aggregation.neighbours={sparse_neighbours(per_round)}"])]


def client_sets(count: int, per_round: int, rounds: int) -> list[str]:
    return ["run.algorithm=delta_avg", "run.model=mlp_classifier", "run.dataset=letters",
            "data.format=letters", "run.seed=1", f"run.rounds={rounds}",
            "outputs.checkpoint_every=0", f"clients.count={count}", "clients.partition=iid",
            f"clients.per_round={per_round}", "delta_avg.epochs=1",
            "delta_avg.local_optimizer=sgd", "delta_avg.batch_size=8", "delta_avg.eta=0.05"]


# ------------------------------------------------------------------ 1. through processes
def trained_by_round(run_dir: Path) -> dict[int, list[str]]:
    """The clients each round trained, from the run's clients.jsonl."""
    trained: dict[int, list[str]] = {}
    for line in (run_dir / "clients.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "node" in row:
            trained.setdefault(row["round"], []).append(row["client"])
    return {r: sorted(names) for r, names in sorted(trained.items())}


def parameter_count(run_dir: Path) -> int:
    from thrift_trainer.training.outputs.model_file import load_model

    weights, _ = load_model(run_dir / "model.npz")
    return int(sum(np.size(value) for value in weights.values()))


def run_figures(rows: list[dict[str, Any]], params: int) -> dict[str, Any]:
    """A run's medians over the rounds after the first."""
    later = [row for row in rows if row["round"] >= 2]
    per_value = [(row["bytes_down"] + row["bytes_up"]) / (params * row["clients_trained"])
                 for row in later]
    phases = sorted({name for row in later for name in row["phase_seconds"]})
    return {
        "round_seconds_median": statistics.median(row["seconds"] for row in later),
        "round_seconds": [round(row["seconds"], 4) for row in rows],
        "bytes_down_median": statistics.median(row["bytes_down"] for row in later),
        "bytes_up_median": statistics.median(row["bytes_up"] for row in later),
        "bytes_per_parameter_client": statistics.median(per_value),
        "bytes_down_per_parameter_client": statistics.median(
            row["bytes_down"] / (params * row["clients_trained"]) for row in later),
        "bytes_up_per_parameter_client": statistics.median(
            row["bytes_up"] / (params * row["clients_trained"]) for row in later),
        "phase_seconds_median": {name: statistics.median(
            row["phase_seconds"].get(name, 0.0) for row in later) for name in phases},
        "clients_trained": [row["clients_trained"] for row in rows]}


def measure_size(cluster: FederatedCluster, args: argparse.Namespace,
                 per_round: int) -> dict[str, Any]:
    """One round size's plain and secure runs on the same cluster, with their ratios."""
    runs: dict[str, Any] = {}
    for name, extra in variants(per_round):
        run = cluster.follow(client_sets(args.count, per_round, args.rounds) + extra,
                             timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"{name} at {per_round} clients: the client ended with "
                               f"{run.returncode}: {run.stderr}\n{cluster.logs()[-6000:]}")
        params = parameter_count(run.run_dir)
        runs[name] = {"neighbours": _neighbours_of(extra), "parameters": params,
                      "trained": trained_by_round(run.run_dir),
                      "validation_error": json.loads(run.stdout)["validation_error"],
                      **run_figures(run.rows, params)}
        print(f"{per_round} a round, {name}: {runs[name]['round_seconds_median']:.3f} s, "
              f"{runs[name]['bytes_per_parameter_client']:.2f} B per parameter and client",
              file=sys.stderr, flush=True)
    trained = {name: run.pop("trained") for name, run in runs.items()}
    plain = runs["plain"]
    for name, run in runs.items():
        run["same_clients_as_plain"] = trained[name] == trained["plain"]
        run["ratio_round_seconds"] = run["round_seconds_median"] / plain["round_seconds_median"]
        run["ratio_bytes"] = run["bytes_per_parameter_client"] / \
            plain["bytes_per_parameter_client"]
    return {"per_round": per_round, "runs": runs}


def _neighbours_of(extra: list[str]) -> int | None:
    for item in extra:
        if item.startswith("secure_aggregation.neighbours="):
            return int(item.split("=", 1)[1])
    return None


def through_processes(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    with FederatedCluster(workdir, args.count, nodes=NODES) as cluster:
        return [measure_size(cluster, args, per_round) for per_round in args.per_round]


# ------------------------------------------------------------------ 2. Flower
def flower_settings(per_round: int, neighbours: int | None, rounds: int,
                    threshold: float = 0.6, clip_range: float = 1.0) -> dict[str, Any]:
    """Flower's SecAgg+ settings for ours (None neighbours: plain FedAvg); see the module
    docstring for the mapping."""
    quantization = 1 << ((1 << BITS) // per_round).bit_length() - 1
    return {"clients": per_round, "rounds": rounds, "secure": neighbours is not None,
            "num_shares": 1.0 if not neighbours else neighbours + 1,
            "reconstruction_threshold": threshold, "clipping_range": clip_range,
            "quantization_range": quantization, "modulus_range": 1 << BITS,
            "max_weight": 1000.0, "data": str(DATA), "count": COUNT, "hidden": 64,
            "epochs": 1, "batch": 8, "lr": 0.05, "seed": 1, "cpus": 2}


def flower_python(args: argparse.Namespace) -> tuple[Path | None, str]:
    """Flower's interpreter, installing it first unless told not to; or None and why."""
    python = args.flower_venv / "bin" / "python"
    check = [str(python), "-c", "import flwr, ray; print(flwr.__version__, ray.__version__)"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python, ""
    if args.no_install:
        return None, f"no flwr with ray in {args.flower_venv} (--no-install)"
    print(f"installing {FLOWER_SPEC} into {args.flower_venv} ...", file=sys.stderr,
          flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(args.flower_venv)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", FLOWER_SPEC],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"pip install {FLOWER_SPEC} failed: {done.stderr[-1500:]}"
    return python, ""


def run_flower(python: Path, settings: dict[str, Any], workdir: Path,
               timeout: float = 1200.0) -> dict[str, Any]:
    """One Flower simulation; its figures, or the error it ended with."""
    name = f"flower-{settings['clients']}-{settings['secure']}-{settings['num_shares']}"
    path, out, log = (workdir / f"{name}.{ext}" for ext in ("settings.json", "json", "log"))
    path.write_text(json.dumps(settings))
    with open(log, "w") as sink:
        try:
            done = subprocess.run([str(python), str(REPO / "bench" / "flower_secagg_app.py"),
                                   str(path), str(out)], stdout=sink,
                                  stderr=subprocess.STDOUT, timeout=timeout, cwd=workdir)
        except subprocess.TimeoutExpired:
            return {"error": f"no result in {timeout:.0f} s: {log.read_text()[-3000:]}"}
    if done.returncode != 0 or not out.exists():
        return {"error": f"exit {done.returncode}: {log.read_text()[-3000:]}"}
    report = json.loads(out.read_text())
    # the rounds after the first; a one-round run has only its first (start-up included)
    skip = 1 if len(report["round_seconds"]) > 1 else 0
    report["warm_up_included"] = skip == 0
    params, clients = report["parameters"], settings["clients"]
    report["round_seconds_median"] = statistics.median(report["round_seconds"][skip:])
    report["bytes_per_parameter_client"] = statistics.median(
        (sent + received) / (params * clients)
        for sent, received in report["round_bytes"][skip:])
    report["stage_seconds_median"] = {stage: statistics.median(
        row[stage] for row in report["stage_seconds"][skip:]) for stage in
        (report["stage_seconds"][0] if report["stage_seconds"] else {})}
    return report


def flower_rounds(args: argparse.Namespace, per_round: int, neighbours: int | None) -> int:
    """Flower's rounds for one case: one only for its complete graph at 50 clients or more,
    whose pure-Python Shamir sharing (pycryptodome's, over 16-byte chunks) takes minutes a
    round on this machine; else ``--flower-rounds``."""
    return 1 if neighbours == 0 and per_round >= 50 else args.flower_rounds


def flower_primitives(python: Path, args: argparse.Namespace, workdir: Path
                      ) -> dict[str, Any]:
    """Flower's Shamir split and combine and its mask generator, in its own process."""
    out = workdir / "flower-primitives.json"
    done = subprocess.run([str(python), str(REPO / "bench" / "flower_secagg_app.py"),
                           "--primitives", ",".join(map(str, args.per_round)),
                           ",".join(map(str, args.sizes)), str(out)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr[-3000:]}
    return json.loads(out.read_text())


def flower_side(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, Any],
                                                                    str | None]:
    python, why = flower_python(args)
    if python is None:
        return {}, why
    sizes = []
    for per_round in args.per_round:
        runs = {}
        for name, neighbours in (("plain", None), ("secure-complete", 0),
                                 (f"secure-k{sparse_neighbours(per_round)}",
                                  sparse_neighbours(per_round))):
            settings = flower_settings(per_round, neighbours,
                                       flower_rounds(args, per_round, neighbours))
            runs[name] = {"settings": settings, **run_flower(python, settings, workdir)}
            print(f"Flower, {per_round} a round, {name}: "
                  f"{runs[name].get('round_seconds_median', runs[name].get('error'))}",
                  file=sys.stderr, flush=True)
        plain = runs["plain"]
        for run in runs.values():
            if "error" not in run and "error" not in plain:
                run["ratio_round_seconds"] = run["round_seconds_median"] / \
                    plain["round_seconds_median"]
                run["ratio_bytes"] = run["bytes_per_parameter_client"] / \
                    plain["bytes_per_parameter_client"]
        sizes.append({"per_round": per_round, "runs": runs})
    return {"sizes": sizes, "primitives": flower_primitives(python, args, workdir)}, None


# ------------------------------------------------------------------ 3. in-process
def _timed(call: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began


def primitives(clients: int, neighbours: int, sizes: list[int],
               timed_clients: int = 2) -> dict[str, Any]:
    """One in-process round of ``clients`` SecAggClients: keys, shares and unmask answers
    of every client (mean per client); the masks of ``timed_clients`` clients per size
    (the others mask one value, which the coordinator's cost does not depend on); the
    coordinator's unmask_sum over a sum of that size (its values do not change the work);
    one ChaCha20 expansion of that size (median of 5), times the expansions a client's
    mask and the coordinator's sum make, as the PRG's part of each."""
    from thrift_trainer.training.secure_aggregation import prg, quantize, server
    from thrift_trainer.training.secure_aggregation.client import SecAggClient

    threshold, clip = 0.6, 1.0
    context = b"bench/1/secure-aggregation"
    SecAggClient(context, "warm-up").public_keys()  # the first call's imports and set-up
    names = [f"client{i:03d}" for i in range(clients)]
    made, keys_s = _timed(lambda: [SecAggClient(context, name) for name in names])
    keys = {c.client: c.public_keys() for c in made}
    sealed: dict[str, dict[str, bytes]] = {}
    shares_s = 0.0
    for client in made:
        sealed[client.client], seconds = _timed(
            lambda c=client: c.share_keys(keys, neighbours, threshold))
        shares_s += seconds
    scale = quantize.scale_for(clip, BITS, clients)
    rng = np.random.default_rng(0)
    mask_s: dict[int, list[float]] = {}
    rest = iter(made)
    for size in sizes:
        mask_s[size] = []
        for _ in range(timed_clients):
            client = next(rest)
            values = rng.uniform(-0.1, 0.1, size)
            _, seconds = _timed(lambda c=client, v=values: c.mask(v, 1 / clients, names,
                                                                  clip, scale, BITS))
            mask_s[size].append(seconds)
    for client in rest:
        client.mask(np.zeros(1), 1 / clients, names, clip, scale, BITS)
    revealed, unmask_s = {}, 0.0
    for client in made:
        to_me = {sender: to[client.client] for sender, to in sealed.items()
                 if client.client in to}
        revealed[client.client], seconds = _timed(
            lambda c=client, s=to_me: c.unmask(s, names))
        unmask_s += seconds
    per_size = {}
    for size in sizes:
        total = rng.integers(0, 1 << BITS, size, dtype=np.uint64).astype(np.uint32)
        _, sum_s = _timed(lambda t=total: server.unmask_sum(
            [t], keys, names, names, revealed, neighbours, threshold, context, BITS))
        prg_s = statistics.median(_timed(lambda s=size: prg.expand(bytes(32), s, BITS))[1]
                                  for _ in range(5))
        degree = len(next(iter(sealed.values())))
        per_size[str(size)] = {
            "client_mask_seconds": statistics.median(mask_s[size]),
            "client_prg_seconds_estimate": prg_s * (1 + degree),
            "coordinator_unmask_seconds": sum_s,
            "coordinator_prg_seconds_estimate": prg_s * clients,
            "one_expansion_seconds": prg_s}
    return {"clients": clients, "neighbours": neighbours,
            "degree": len(next(iter(sealed.values()))),
            "client_keys_seconds": keys_s / clients,
            "client_shares_seconds": shares_s / clients,
            "client_unmask_seconds": unmask_s / clients,
            "sizes": per_size}


def in_process(args: argparse.Namespace) -> list[dict[str, Any]]:
    cases = []
    for per_round in args.per_round:
        for neighbours in (0, sparse_neighbours(per_round)):
            row = primitives(per_round, neighbours, args.sizes)
            print(f"in-process, {per_round} clients, k={neighbours}: shares "
                  f"{row['client_shares_seconds'] * 1000:.1f} ms a client", file=sys.stderr,
                  flush=True)
            cases.append(row)
    return cases


# ------------------------------------------------------------------ report
def report(result: dict[str, Any]) -> str:
    lines = ["Through processes (medians over rounds 2..R; ratio: secure / plain)", "",
             "| clients a round | run | round s | x plain | bytes / (param x client) | "
             "x plain | keys s | shares s | train s | unmask s | sum s |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size in result["rounds"]:
        for name, run in size["runs"].items():
            phases = run["phase_seconds_median"]
            cells = " | ".join(f"{phases[p]:.3f}" if p in phases else "-"
                               for p in SECURE_PHASES)
            lines.append(f"| {size['per_round']} | {name} | {run['round_seconds_median']:.3f}"
                         f" | {run['ratio_round_seconds']:.2f} | "
                         f"{run['bytes_per_parameter_client']:.2f} | "
                         f"{run['ratio_bytes']:.2f} | {cells} |")
    if result["flower"]:
        lines += ["", "Flower (simulation, Ray 2 CPUs; *: one round, start-up included)", "",
                  "| clients a round | run | round s | x plain | bytes / (param x client) |"
                  " x plain | " + " | ".join(FLOWER_STAGES) + " |",
                  "| ---: | --- | ---: | ---: | ---: | ---: |" + " ---: |" * 4]
        for size in result["flower"]["sizes"]:
            for name, run in size["runs"].items():
                if "error" in run:
                    lines.append(f"| {size['per_round']} | {name} | error | | | |")
                    continue
                stages = run["stage_seconds_median"]
                cells = " | ".join(f"{stages[s]:.3f}" if s in stages else "-"
                                   for s in FLOWER_STAGES)
                star = "*" if run["warm_up_included"] else ""
                lines.append(f"| {size['per_round']} | {name} | "
                             f"{run['round_seconds_median']:.3f}{star} | "
                             f"{run.get('ratio_round_seconds', float('nan')):.2f} | "
                             f"{run['bytes_per_parameter_client']:.2f} | "
                             f"{run.get('ratio_bytes', float('nan')):.2f} | {cells} |")
    lines += ["", "In-process (ms)", "",
              "| clients | neighbours | parameters | keys | shares | mask | "
              "of which PRG (est.) | unmask answer | coordinator unmask_sum |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for case in result["in_process"]:
        for size, row in case["sizes"].items():
            lines.append(
                f"| {case['clients']} | {case['degree']} | {int(size):,} | "
                f"{case['client_keys_seconds'] * 1e3:.2f} | "
                f"{case['client_shares_seconds'] * 1e3:.2f} | "
                f"{row['client_mask_seconds'] * 1e3:.1f} | "
                f"{row['client_prg_seconds_estimate'] * 1e3:.1f} | "
                f"{case['client_unmask_seconds'] * 1e3:.2f} | "
                f"{row['coordinator_unmask_seconds'] * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # only for its version, after the arguments are checked

    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    notes = []
    with tempfile.TemporaryDirectory(prefix="bench-secure-aggregation-") as tmp:
        rounds = through_processes(args, Path(tmp) / "cluster")
        flower: dict[str, Any] = {}
        if args.flower:
            flower, why = flower_side(args, Path(tmp))
            if why:
                notes.append(f"Flower side skipped: {why}")
        else:
            notes.append("Flower side not run (--quick or --no-flower)")
    load_mid = os.getloadavg()
    cases = in_process(args)
    result = {"machine": machine, "load_average_before": load_before,
              "load_average_middle": load_mid, "load_average_after": os.getloadavg(),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items() if k != "out"},
              "client_sets": client_sets(args.count, args.per_round[0], args.rounds),
              "bits": BITS, "notes": notes, "rounds": rounds, "flower": flower,
              "in_process": cases}
    print(report(result))
    for note in notes:
        print(note)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
