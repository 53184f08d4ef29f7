"""`client.py sweep`: a grid of settings, each over a few seeds, trained through the cluster
one run after another, ended by the comparison of `client.py compare` with each setting's
mean and spread over its seeds.

    client.py sweep HOST PORT --config BASE --grid delta_avg.eta=0.01,0.1 \\
        --grid delta_avg.local_optimizer=sgd,adam --seeds 1,2,3

Every combination's configuration is loaded and checked before the first run starts, so a
typo costs nothing. A run that fails is reported and the sweep goes on; the exit status is
then 1. Each run's model and record go to the sweep's folder, with `compare.png` and
`compare.json` at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrift_trainer.client.compare import compare, save_record, table_lines
from thrift_trainer.client.errors import ClientError
from thrift_trainer.wire.generated import ttypes

MAX_RUNS = 1000  # a grid larger than this is surely a mistake


@dataclass(frozen=True)
class PlannedRun:
    """One run of the sweep: its id and the `--set` items that make it."""

    run_id: str
    sets: tuple[str, ...]
    request: ttypes.TrainRequest


def split_values(text: str) -> list[str]:
    """`v1,v2,...` split on the commas outside brackets, so `[64,64],[128]` is two values."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    return [value.strip() for value in values]


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each `--grid SECTION.KEY=V1,V2` as (key, values); ValueError says which is wrong."""
    grid = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or "." not in key:
            raise ValueError(f"--grid {item!r}: expected SECTION.KEY=VALUE1,VALUE2,...")
        parts = split_values(values)
        if not all(parts):
            raise ValueError(f"--grid {item!r}: an empty value")
        grid.append((key.strip(), parts))
    return grid


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         f"seeds") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be distinct and not negative: {text!r}")
    return seeds


def plan(name: str, grid: Sequence[tuple[str, list[str]]], seeds: Sequence[int] | None,
         base_sets: Sequence[str],
         build: Callable[[list[str], str], ttypes.TrainRequest]) -> list[PlannedRun]:
    """Every combination of the grid with every seed (`run.seed`), each request built (and
    so checked) by `build(sets, run_id)` before anything runs."""
    combinations = list(itertools.product(*[[f"{key}={v}" for v in values]
                                            for key, values in grid]))
    seed_sets = [[f"run.seed={seed}"] for seed in seeds] if seeds else [[]]
    count = len(combinations) * len(seed_sets)
    if count > MAX_RUNS:
        raise ValueError(f"the sweep would run {count} runs (at most {MAX_RUNS})")
    planned = []
    for index, combination in enumerate(combinations, 1):
        for seed_set in seed_sets:
            suffix = f"-s{seed_set[0].split('=')[1]}" if seed_set else ""
            run_id = f"{name}-{index:02d}{suffix}"
            sets = (*base_sets, *combination, *seed_set)
            planned.append(PlannedRun(run_id, sets, build(list(sets), run_id)))
    return planned


def run_all(planned: Sequence[PlannedRun], folder: Path,
            train: Callable[[PlannedRun], dict[str, Any]],
            say: Callable[[str], None]) -> tuple[list[Path], list[str]]:
    """Train each planned run in turn with `train` (its result as --json prints it, or
    ClientError); the records written and the failures, one line each."""
    records, failures = [], []
    for number, run in enumerate(planned, 1):
        say(f"run {number}/{len(planned)} {run.run_id}: {' '.join(run.sets)}")
        try:
            result = train(run)
        except ClientError as exc:
            failures.append(f"{run.run_id}: {exc}")
            say(f"  failed: {exc}")
            continue
        records.append(save_record(folder / f"{run.run_id}.json", run.request, result))
        say(f"  validation_error {result['validation_error']:.4f} in "
            f"{result['wall_seconds']:.1f} s")
    return records, failures


def finish(records: Sequence[Path], failures: Sequence[str], folder: Path, title: str,
           as_json: bool) -> int:
    """The comparison of the finished runs, printed and saved; 1 if any run failed."""
    if not records:
        raise ClientError("no run of the sweep finished: " + "; ".join(failures))
    compared = compare(records, folder / "compare.png", title=title)
    compared["failed"] = list(failures)
    (folder / "compare.json").write_text(json.dumps(compared, indent=1) + "\n")
    if as_json:
        print(json.dumps(compared, indent=1))
    else:
        print("\n".join(table_lines(compared["settings"])))
        print(f"picture: {compared['picture']}")
        for failure in failures:
            print(f"failed: {failure}")
    return 1 if failures else 0
