"""How many rounds topk needs on the letters recommended configuration, and what a sparse
support of that size allows at best: in-process replays, one process, no wire.

Each replay runs configs/letters_recommended.yaml as the system does in deterministic mode:
each unit's local training is the algorithm's node half (`DeltaAveraging.run_unit`), its
update goes through `compression.compress_update` with the unit slot's error feedback
residual in a node session store, the coordinator decodes it (`compression.decompress`)
and combines the round by the algorithm's own `aggregate` (weighted mean, FedAvgM). At 10
rounds the errors equal bench/compression.py's system runs (0.0651 none, 0.3634 topk 1 %).

Variants (``--variants``, ';'-separated):

* ``none``: dense updates, the base;
* ``topk F%``: each unit sends the top F % of each tensor of its update plus residual;
* ``topk F%, warm-up W``: the same after W denser rounds (``topk_warmup_rounds``);
* ``coordinator top S%``: an idealised coordinator that receives every dense update, combines
  them, and applies only the top S % of the combined update, keeping the rest as its own
  error feedback residual. With S = 11 (11 units of 1 % each, no overlap) it changes as many
  entries per round as topk 1 % can at most, each with the exact combined value, so it shows
  what a sparse support of that size allows, whoever chooses it.

For each: the validation error after 10 rounds and at the end, the first round within
``--margin`` of none's 10-round error, and the update payload bytes (values, indices and
shapes; frame headers excluded) sent up to that round against none's 10 rounds.

    python bench/topk_horizon.py [--rounds 40] [--margin 0.02] [--variants "none; topk 1%"]
                                 [--set epochs=2 ...]

``--set KEY=VALUE`` changes a key of the recipe's ``delta_avg`` section in every replay.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.machine import describe  # noqa: E402
from thrift_trainer.compute_node.sessions import SessionStore  # noqa: E402
from thrift_trainer.training import compression  # noqa: E402
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging  # noqa: E402
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT  # noqa: E402
from thrift_trainer.training.units import UnitJob, UnitResult, UnitSpec, Weights  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "configs" / "letters_recommended.yaml"
DATA = DEFAULT_DATA_ROOT / "letters"
BASE_ROUNDS = 10  # the recommended configuration's rounds: what the targets compare with
DEFAULT_VARIANTS = ("none; topk 1%; topk 5%; topk 1%, warm-up 4; coordinator top 11%; "
                    "coordinator top 1%")
# Sent per unit: the unit's payload (dense, or compressed with its slot's residual).
Encoder = Callable[[int, UnitSpec, Weights], tuple[Weights, int]]
# Applied per round: the coordinator's combined update, before the server step.
Filter = Callable[[Weights], Weights]


@dataclass
class Replay:
    """Errors after each round and update payload bytes sent up to each round."""

    errors: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)


def recipe_algorithm(changes: dict[str, object] | None = None) -> DeltaAveraging:
    section = yaml.safe_load(RECIPE.read_text())["delta_avg"]
    return DeltaAveraging("mlp", {**section, **(changes or {})}, DATA)


def parse_set(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as YAML (``epochs=2``, ``hidden=[64]``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set wants KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def payload_bytes(payload: Weights) -> int:
    return sum(np.asarray(v).nbytes for v in payload.values())


def dense(round_index: int, unit: UnitSpec, update: Weights) -> tuple[Weights, int]:
    return update, payload_bytes(update)


def node_topk(settings: compression.CompressionSettings) -> Encoder:
    """Each unit's update compressed as a node does it, its slot's residual in a store."""
    sessions = SessionStore()

    def encode(round_index: int, unit: UnitSpec, update: Weights) -> tuple[Weights, int]:
        payload = compression.compress_update(update, settings, sessions, "horizon",
                                              unit.unit_id, round_index)
        return compression.decompress(payload), payload_bytes(payload)

    return encode


def coordinator_topk(fraction: float) -> Filter:
    """The combined update's top ``fraction`` of each tensor, with the rest kept back."""
    residual: Weights = {}

    def apply(combined: Weights) -> Weights:
        nonlocal residual
        payload, residual = compression.compress(combined, "topk", fraction, residual)
        return compression.decompress(payload)

    return apply


def replay(rounds: int, encode: Encoder = dense, sparsify: Filter | None = None,
           changes: dict[str, object] | None = None) -> Replay:
    algorithm = recipe_algorithm(changes)
    weights = algorithm.initial_weights()
    out, sent = Replay(), 0
    for round_index in range(1, rounds + 1):
        results = []
        for unit in algorithm.plan_round(round_index):
            job = UnitJob(run_id="horizon", round=round_index, unit=unit, model="mlp",
                          config=algorithm.config, weights=weights)
            output = DeltaAveraging.run_unit(job, DATA)
            update, size = encode(round_index, unit, output.update)
            sent += size
            results.append(UnitResult(unit, update, output.num_samples))
        if sparsify is None:
            weights = algorithm.aggregate(round_index, weights, results, [])
        else:
            weights = algorithm.apply(weights, sparsify(algorithm.combine(results)))
        out.errors.append(algorithm.evaluate(weights).validation_error)
        out.bytes_sent.append(sent)
    return out


def variant(label: str, rounds: int, changes: dict[str, object] | None = None) -> Replay:
    """The replay a label names, with the recipe's ``changes``; ValueError for a label it
    does not know."""
    if label == "none":
        return replay(rounds, changes=changes)
    found = re.fullmatch(r"topk ([\d.]+)%(?:, warm-up (\d+))?", label)
    if found:
        settings = compression.CompressionSettings(
            up="topk", topk_fraction=float(found[1]) / 100,
            topk_warmup_rounds=int(found[2] or 0))
        return replay(rounds, node_topk(settings), changes=changes)
    found = re.fullmatch(r"coordinator top ([\d.]+)%", label)
    if found:
        return replay(rounds, sparsify=coordinator_topk(float(found[1]) / 100),
                      changes=changes)
    raise ValueError(f"unknown variant {label!r}: none, 'topk F%[, warm-up W]' or "
                     "'coordinator top S%'")


def row(label: str, result: Replay, base: Replay, margin: float, idealised: bool) -> str:
    target = base.errors[BASE_ROUNDS - 1] + margin
    reached = next((i for i, e in enumerate(result.errors) if e <= target), None)
    end = f"{result.errors[-1]:.4f}"
    if reached is None:
        return f"| {label} | {result.errors[BASE_ROUNDS - 1]:.4f} | {end} | not reached | - |"
    fewer = ("- (dense updates)" if idealised else
             f"{base.bytes_sent[BASE_ROUNDS - 1] / result.bytes_sent[reached]:.1f}x fewer")
    return (f"| {label} | {result.errors[BASE_ROUNDS - 1]:.4f} | {end} | {reached + 1} "
            f"({result.errors[reached]:.4f}) | {fewer} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40,
                        help="rounds per replay (default 40; at least 10)")
    parser.add_argument("--margin", type=float, default=0.02,
                        help="the target: none's 10-round error plus this (default 0.02)")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help=f"';'-separated; none always runs first (default: "
                             f"{DEFAULT_VARIANTS.replace('%', '%%')})")
    parser.add_argument("--set", dest="changes", action="append", type=parse_set, default=[],
                        metavar="KEY=VALUE", help="change a key of the recipe's delta_avg "
                        "section (repeatable), e.g. --set epochs=2")
    args = parser.parse_args(argv)
    if args.rounds < BASE_ROUNDS:
        parser.error(f"--rounds must be at least {BASE_ROUNDS}")
    labels = ["none", *(s.strip() for s in args.variants.split(";")
                        if s.strip() and s.strip() != "none")]
    results = {}
    for label in labels:
        started = time.monotonic()
        try:
            results[label] = variant(label, args.rounds, dict(args.changes))
        except ValueError as exc:  # a bad label or a recipe change the algorithm refuses
            parser.error(str(exc))
        print(f"{label}: {results[label].errors[-1]:.4f} after {args.rounds} rounds, "
              f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    base = results["none"]
    changed = "".join(f"; {key} = {value}" for key, value in args.changes)
    print(f"{describe()}; {args.rounds} rounds each{changed}; target: none's error after "
          f"{BASE_ROUNDS} rounds ({base.errors[BASE_ROUNDS - 1]:.4f}) + {args.margin:g}\n")
    print(f"| variant | error, {BASE_ROUNDS} rounds | error, {args.rounds} rounds | "
          f"first round on target | update bytes to it vs none's {BASE_ROUNDS} rounds |")
    print("|---|---|---|---|---|")
    for label, result in results.items():
        print(row(label, result, base, args.margin, label.startswith("coordinator")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
