"""The worked examples of examples/ at full size, through real processes, as their READMEs run them.

Each example's config runs as it is on a cluster of its own: 2 compute nodes (load 0) and a
coordinator on 127.0.0.1 started with the example's ``--plugins`` and the client with
``--config``. The table gives the final validation error and loss, the rounds and the
client's wall time (from its request to the result: the checks before round 1 and the
nodes' first import of torch included). For the language model it also prints bytes
sampled from the run's ``model.safetensors`` loaded into the plug-in's module with plain
torch. Every child runs with OMP_NUM_THREADS=1 and is ended by its PID.

    python bench/examples.py                          # about 6 minutes on 2 cores
    python bench/examples.py --only gpt-sync_sgd --set run.rounds=20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every child

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools import gpt_example  # noqa: E402
from devtools.machine import describe  # noqa: E402
from devtools.throughput import train_on_cluster  # noqa: E402

RESULTS = REPO / "bench" / "results" / "examples.json"
EXAMPLES = {  # name: (folder, config, plug-ins)
    "cnn": ("cnn", "run.yaml", "resnet_cnn"),
    "tabular": ("tabular", "letters_csv.yaml", ""),
    "gpt-sync_sgd": ("gpt", "sync_sgd.yaml", "gpt_model,stdlib_corpus"),
    "gpt-diloco": ("gpt", "diloco.yaml", "gpt_model,stdlib_corpus"),
}


def run_example(name: str, sets: list[str], workdir: Path) -> dict[str, Any]:
    """One example's run; the processes read the checkout's data/, as the READMEs say."""
    folder, config, plugins = EXAMPLES[name]
    where = []
    if plugins:
        where = ["--plugins", plugins, "--plugin-dir", str(REPO / "examples" / folder)]
    client = ["--config", f"examples/{folder}/{config}",
              *[arg for pair in sets for arg in ("--set", pair)]]
    result = train_on_cluster(2, client, workdir, node_args=where, coordinator_args=where,
                              timeout=3600).result
    scored = [row for row in result["history"] if row["validation_loss"] == row[
        "validation_loss"]]  # rounds without an evaluation hold NaN
    found = {"config": f"examples/{folder}/{config}", "sets": sets,
             "rounds": result["rounds"], "wall_seconds": result["wall_seconds"],
             "validation_error": scored[-1]["validation_error"],
             "validation_loss": scored[-1]["validation_loss"],
             "bytes": result["bytes_up"] + result["bytes_down"]}
    if folder == "gpt":
        found["sample"] = gpt_sample(Path(result["coordinator_run_dir"]))
    return found


def gpt_sample(run_dir: Path) -> str:
    """120 bytes after ``def `` from the run's model file, loaded strict with plain torch
    into the module built with the arguments its metadata names."""
    with safe_open(str(run_dir / "model.safetensors"), "pt") as opened:
        description = json.loads(opened.metadata()["description"])
    model = gpt_example.gpt_model.GPT(**description["model_args"])
    model.load_state_dict(load_file(run_dir / "model.safetensors"), strict=True)
    return gpt_example.gpt_model.sample(model, b"def ", 120).decode(errors="replace")


def report(found: dict[str, dict[str, Any]]) -> str:
    lines = ["| example | config | rounds | validation error | validation loss | bytes | "
             "wall s |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in found.items():
        lines.append(f"| {name} | `{row['config']}` | {row['rounds']} | "
                     f"{row['validation_error']:.4f} | {row['validation_loss']:.4f} | "
                     f"{row['bytes']:,} | {row['wall_seconds']:.1f} |")
    for name, row in found.items():
        if "sample" in row:
            lines += ["", f"{name}, sampled after `def `:", "```", row["sample"], "```"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(EXAMPLES),
                        help="run this example only (repeatable; default: every one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override passed to every run's client")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where the figures go (default {RESULTS.relative_to(REPO)}, "
                             "only when every example runs with no --set)")
    args = parser.parse_args(argv)
    machine = describe(f"torch {torch.__version__}")
    load_before = os.getloadavg()
    print(f"{machine}; load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-examples-") as tmp:
        for name in args.only or EXAMPLES:
            found[name] = run_example(name, args.set, Path(tmp) / name)
            print(f"{name}: {found[name]['validation_error']:.4f} after "
                  f"{found[name]['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
    print(report(found))
    out = args.out or (RESULTS if not args.only and not args.set else None)
    if out is not None:
        out.write_text(json.dumps({"machine": machine, "load_average_before": load_before,
                                   "load_average_after": os.getloadavg(),
                                   "examples": found}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
