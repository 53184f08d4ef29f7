"""Robust aggregation against Byzantine nodes, through the real system.

Each scenario starts 5 compute nodes (no load), of which 0 or 1 sends Byzantine updates
(`--corrupt-updates signflip|scaled|random` from its first unit), a coordinator with
`--max-update-norm 0` (so the aggregation rule alone faces the bad updates) and the client,
all as separate processes on 127.0.0.1, and trains the letters recommended configuration
(configs/letters_recommended.yaml, 11 units a round) with each aggregation rule. It
records the final validation error and the wall time.

The coordinator's own time per round is measured in process on the code it runs: the
round's 11 results (the recommended MLP's shapes) combined by the algorithm's rule, then
`apply` and `evaluate` of DeltaAveraging; the median of many repeats.

    python bench/robust.py [--rounds 10] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging  # noqa: E402
from thrift_trainer.training.run_config import load_run_config  # noqa: E402
from thrift_trainer.training.units import UnitResult  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "configs" / "letters_recommended.yaml"
NODES = 5
RULES = ("mean", "median", "trimmed_mean", "krum")
ATTACKS = ("none", "signflip", "scaled", "random")
# f = 3: one node of 5 may send 3 of a round's 11 updates; keep at most 11 - 2f - 2 = 3.
SETTINGS = ["aggregation.byzantine=3", "aggregation.krum_keep=3"]
TARGET_ERROR = 0.12


def run_once(rule: str, attack: str, rounds: int, workdir: Path, extra_sets: list[str]
             ) -> dict:
    nodes = []
    coordinator = None
    try:
        for i in range(NODES):
            bad = attack != "none" and i == 0
            extra = ["--corrupt-updates", attack] if bad else []
            nodes.append(local_cluster.start_node(workdir, f"node{i}", 0.0, "--seed", str(i + 1),
                                                  "--log-level", "WARNING", *extra))
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 2, "--seed", "1",
                                                      "--max-update-norm", "0",
                                                      "--log-level", "WARNING")
        sets = [f"aggregation.rule={rule}", f"run.rounds={rounds}", *SETTINGS, *extra_sets]
        args = ["127.0.0.1", str(coordinator.port), "--config", str(RECIPE), "--json",
                "--quiet", *[item for s in sets for item in ("--set", s)]]
        started = time.monotonic()
        done = local_cluster.run_client(args, workdir, timeout=1800)
        wall = time.monotonic() - started
        if done.returncode != 0:
            return {"wall": wall, "error": float("nan"), "failed": done.stderr.strip()[-200:]}
        result = json.loads(done.stdout)
        return {"wall": wall, "error": result["validation_error"]}
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def coordinator_seconds(repeats: int, extra_sets: list[str]) -> dict[str, dict]:
    """Per rule, the median seconds of one round's aggregation, and of aggregation + apply
    + evaluate. The rules take turns within each repeat, so load on the machine weighs on
    all of them alike."""
    rounds = {rule: _round_of(rule, extra_sets) for rule in RULES}
    times: dict[str, dict[str, list[float]]] = {r: {"aggregation": [], "round": []}
                                                 for r in RULES}
    for _ in range(repeats):
        for rule, run_round in rounds.items():
            aggregation, total = run_round()
            times[rule]["aggregation"].append(aggregation)
            times[rule]["round"].append(total)
    return {rule: {key: statistics.median(values) for key, values in kept.items()}
            for rule, kept in times.items()}


def _round_of(rule: str, extra_sets: list[str]):
    """A function timing the coordinator's part of one round under `rule`."""
    config = load_run_config(RECIPE, [f"aggregation.rule={rule}", *SETTINGS, *extra_sets])
    algorithm = DeltaAveraging("mlp", config.algorithm_config(), REPO / "data" / "letters")
    weights = algorithm.initial_weights()
    units = algorithm.plan_round(1)
    rng = np.random.default_rng(0)
    results = [UnitResult(unit, {k: rng.normal(scale=1e-3, size=v.shape)
                                 for k, v in weights.items()}, 1500) for unit in units]

    def run_round() -> tuple[float, float]:
        started = time.perf_counter()
        combined = algorithm.combine(results)
        aggregated = time.perf_counter()
        algorithm.evaluate(algorithm.apply(weights, combined))
        return aggregated - started, time.perf_counter() - started
    return run_round


def table(results: dict, timing: dict) -> str:
    rows = ["| rule | " + " | ".join(f"{a}: error / wall s" for a in results) +
            " | aggregation ms/round | coordinator ms/round | vs mean |",
            "|---|" + "---|" * (len(results) + 3)]
    base = timing["mean"]["round"]
    for rule in RULES:
        cells = [f"{results[a][rule]['error']:.4f} / {results[a][rule]['wall']:.1f}"
                 for a in results]
        t = timing[rule]
        rows.append(f"| {rule} | " + " | ".join(cells) +
                    f" | {t['aggregation'] * 1e3:.2f} | {t['round'] * 1e3:.2f} | "
                    f"{t['round'] / base:.2f}x |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per run (default 10, "
                        "the recipe's)")
    parser.add_argument("--quick", action="store_true",
                        help="4 rounds, no attack and signflip only: a smoke run")
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help=f"comma-separated, of {', '.join(ATTACKS)} (default: all)")
    parser.add_argument("--repeats", type=int, default=50,
                        help="repeats of the in-process coordinator timing (default 50)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a further client --set for every run, e.g. "
                             "aggregation.trim_fraction=0.3")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    rounds, attacks = args.rounds, args.attacks.split(",")
    if args.quick:
        rounds, attacks = 4, ["none", "signflip"]
    timing = coordinator_seconds(args.repeats, args.set)
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-robust-") as tmp:
        for attack in attacks:
            for rule in RULES:
                m = run_once(rule, attack, rounds, Path(tmp), args.set)
                print(f"{attack} / {rule}: error {m['error']:.4f}, {m['wall']:.1f}s"
                      f"{' FAILED ' + m['failed'] if 'failed' in m else ''}",
                      file=sys.stderr, flush=True)
                results.setdefault(attack, {})[rule] = m
    print(f"{rounds} rounds, {NODES} nodes, 1 Byzantine where named; "
          f"target with signflip: <= {TARGET_ERROR} for the robust rules; "
          f"settings {', '.join([*SETTINGS, *args.set])}")
    print(table(results, timing))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "runs": results,
                                               "timing": timing}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
