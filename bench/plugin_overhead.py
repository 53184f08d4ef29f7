"""What a plug-in model costs: the built-in ``mlp_classifier`` against the very same
network named as a plug-in (``plugin_overhead:mlp_classifier``, this module), through real
processes, in one run.

Both names build the same function's network (this module's ``mlp_classifier`` calls the
built-in one: a run may name only what a plug-in module defines itself), so the runs train
the same maths from the same weights and end with the same validation error; what differs
is only the path a name takes: a plug-in is resolved from a module the processes allowed
(``--plugins plugin_overhead``), reported with its version, and checked with the model's
fingerprint before round 1 and with every unit. One cluster (2 nodes, a
coordinator, all started with ``--plugins``) serves the runs, built-in and plug-in in
turn (interleaved repeats, so that the machine's slow spells fall on both), each with the
same config: by default the tabular example (examples/tabular/letters_csv.yaml: the letters
table, csv format) under sync_sgd with short rounds, where a per-unit cost would show.
Seconds per round: the mean of the run's rounds after the first (metrics.jsonl: each
round's units out and back, update, evaluation and record); the client's wall time of the
whole run (the checks before round 1 included) is reported too.

    python bench/plugin_overhead.py                 # about 2 minutes
    python bench/plugin_overhead.py --repeats 2 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.machine import describe  # noqa: E402
from devtools.throughput import ClusterRun, LocalCluster  # noqa: E402
from thrift_trainer.training.models import modules  # noqa: E402

BUILT_IN = "mlp_classifier"
PLUGIN = f"{Path(__file__).stem}:mlp_classifier"
CONFIG = REPO / "examples" / "tabular" / "letters_csv.yaml"
# sync_sgd with short rounds: 2 units of 320 rows on 2 nodes, one Adam step on the coordinator
SETTINGS = {"run.algorithm": "sync_sgd", "sync_sgd.images_per_work_unit": 320,
            "sync_sgd.num_workunits_per_update": 2, "sync_sgd.units_per_iteration": 2,
            "sync_sgd.batch_size": 64, "sync_sgd.lr": 0.002}


def mlp_classifier(in_features: int, num_classes: int, hidden: list[int] | None = None,
                   dropout: float = 0.0) -> Any:
    """The plug-in: the built-in network, under this module's name."""
    return modules.mlp_classifier(in_features, num_classes, hidden, dropout)


def client_args(model: str, rounds: int) -> list[str]:
    sets = {**SETTINGS, "run.model": model, "run.rounds": rounds}
    return ["--config", str(CONFIG),
            *[a for key, value in sets.items() for a in ("--set", f"{key}={value}")]]


def seconds_per_round(run: ClusterRun) -> float:
    """The mean seconds of rounds 2 to R (round 1 also warms the run's pools up). Not from
    the coordinator's log: both models log the very same round lines, and a line repeated
    within seconds is folded into a count."""
    return statistics.mean(row["seconds"] for row in run.metrics()[1:])


def summary(times: dict[str, list[float]], errors: dict[str, list[float]],
            walls: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, spreads and the ratio of the medians (plug-in / built-in); the ratio of
    each interleaved pair too, whose spread says what the machine's noise is."""
    pairs = [p / b for b, p in zip(times[BUILT_IN], times[PLUGIN], strict=True)]
    return {
        "median_wall_seconds": {k: statistics.median(v) for k, v in walls.items()},
        "median_seconds_per_round": {k: statistics.median(v) for k, v in times.items()},
        "min_seconds_per_round": {k: min(v) for k, v in times.items()},
        "max_seconds_per_round": {k: max(v) for k, v in times.items()},
        "ratio_of_medians": statistics.median(times[PLUGIN]) /
        statistics.median(times[BUILT_IN]),
        "pair_ratios": pairs,
        "same_validation_error": errors[BUILT_IN] == errors[PLUGIN],
    }


def report(figures: dict[str, Any], rounds: int) -> str:
    medians = figures["median_seconds_per_round"]
    lines = [f"{len(figures['pair_ratios'])} interleaved pairs of {rounds}-round runs",
             "", "| model | median s/round | min | max |", "| --- | ---: | ---: | ---: |"]
    for name in (BUILT_IN, PLUGIN):
        lines.append(f"| `{name}` | {medians[name]:.4f} | "
                     f"{figures['min_seconds_per_round'][name]:.4f} | "
                     f"{figures['max_seconds_per_round'][name]:.4f} |")
    pairs = figures["pair_ratios"]
    walls = figures["median_wall_seconds"]
    lines += ["", "whole runs, median wall seconds (the checks before round 1 included): "
                  + ", ".join(f"`{name}` {walls[name]:.2f}" for name in (BUILT_IN, PLUGIN)),
              "", f"plug-in / built-in, ratio of the medians: "
                  f"**{figures['ratio_of_medians']:.3f}**; of each pair: "
                  f"{', '.join(f'{r:.3f}' for r in pairs)} (range {min(pairs):.3f}-"
                  f"{max(pairs):.3f})",
              "same validation error in every pair: "
              f"{'yes' if figures['same_validation_error'] else 'NO'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs of each model, interleaved (default 5)")
    parser.add_argument("--rounds", type=int, default=60, help="rounds a run (default 60)")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    machine = f"{describe()}; load average {os.getloadavg()[0]:.2f} at the start"
    print(machine, file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {BUILT_IN: [], PLUGIN: []}
    errors: dict[str, list[float]] = {BUILT_IN: [], PLUGIN: []}
    walls: dict[str, list[float]] = {BUILT_IN: [], PLUGIN: []}
    allow = ["--plugins", Path(__file__).stem, "--plugin-dir", str(Path(__file__).parent)]
    with tempfile.TemporaryDirectory(prefix="bench-plugin-") as tmp, \
            LocalCluster(2, Path(tmp), allow, allow) as cluster:
        cluster.train(client_args(BUILT_IN, 2))  # warm-up: torch, the data, the pools
        for repeat in range(args.repeats):
            order = (BUILT_IN, PLUGIN) if repeat % 2 == 0 else (PLUGIN, BUILT_IN)
            for model in order:
                run = cluster.train(client_args(model, args.rounds))
                times[model].append(seconds_per_round(run))
                errors[model].append(run.result["validation_error"])
                walls[model].append(run.result["wall_seconds"])
                print(f"{model}: {times[model][-1]:.4f} s/round, validation error "
                      f"{errors[model][-1]:.4f}", file=sys.stderr, flush=True)
    figures = summary(times, errors, walls)
    print(report(figures, args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": machine, "load_average_before": load_before,
             "load_average_after": os.getloadavg(), "rounds": args.rounds,
             "settings": SETTINGS, "config": str(CONFIG.relative_to(REPO)),
             "seconds_per_round": times, "wall_seconds": walls,
             "validation_errors": errors, **figures},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
