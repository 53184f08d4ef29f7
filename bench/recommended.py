"""The recommended letters configuration as the demo runs it, measured, and the README's
sentence about it generated from the measurement.

The run: 4 compute nodes with loads 0.2/0.4/0.6/0.8 and 3 s load delays, the coordinator
with the adaptive policy (3) and the client with configs/letters_recommended.yaml, all
separate processes on 127.0.0.1 (scripts/demo.py's set-up). It records each round's
validation error, the wall time, the machine's cores and load average, into
bench/results/recommended.json; `--write-readme` then rewrites the README's paragraph
between its `recommended:begin` and `recommended:end` markers from that file
(tests/unit/test_readme_figures.py checks that the two agree).

    python bench/recommended.py [--load-delay 3] [--write-readme]
    python bench/recommended.py --readme-only     # rewrite the README from the saved file
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

REPO = local_cluster.REPO
RECIPE = REPO / "configs" / "letters_recommended.yaml"
RESULTS = REPO / "bench" / "results" / "recommended.json"
README = REPO / "README.md"
LOADS = (0.2, 0.4, 0.6, 0.8)
POLICY = 3
THRESHOLD = 0.10  # the README says from which round on the error stays at most this
BLOCK = re.compile(r"(<!-- recommended:begin -->\n)(.*?)(<!-- recommended:end -->)", re.S)


def measure(load_delay: float) -> dict[str, Any]:
    """One run of the recipe through the demo's cluster; its history and timings."""
    with tempfile.TemporaryDirectory(prefix="recommended-") as tmp:
        workdir = Path(tmp)
        procs = []
        try:
            for i, load in enumerate(LOADS):
                procs.append(local_cluster.start_node(workdir, f"node{i + 1}", load,
                                                      "--load-delay", str(load_delay),
                                                      "--log-level", "WARNING"))
            nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", procs)
            procs.append(local_cluster.start_coordinator(workdir, nodes_file, POLICY,
                                                         "--log-level", "WARNING"))
            load_before = os.getloadavg()[0]
            done = local_cluster.run_client(
                ["127.0.0.1", str(procs[-1].port), "--config", str(RECIPE), "--json",
                 "--quiet"],
                workdir, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"the client failed: {done.stderr}")
            result = json.loads(done.stdout)
        finally:
            for proc in reversed(procs):
                proc.stop()
    return {
        "setup": {"nodes": len(LOADS), "loads": list(LOADS), "load_delay": load_delay,
                  "policy": POLICY, "recipe": str(RECIPE.relative_to(REPO))},
        "machine": {"cores": os.cpu_count(), "load_average_before": round(load_before, 2),
                    "measured": time.strftime("%Y-%m-%d")},
        "history": [round(h["validation_error"], 4) for h in result["history"]],
        "wall_seconds": round(result["wall_seconds"], 1),
    }


def from_round(history: list[float], threshold: float = THRESHOLD) -> int | None:
    """The first round from which the error stays at most `threshold`, or None."""
    for start in range(len(history)):
        if all(error <= threshold for error in history[start:]):
            return start + 1
    return None


def readme_paragraph(results: dict[str, Any]) -> str:
    """The README's sentence about the recommended configuration, from a measurement."""
    history, setup, machine = results["history"], results["setup"], results["machine"]
    steady = from_round(history)
    stays = (f"at most {THRESHOLD:.2f} from round {steady} on" if steady is not None else
             f"above {THRESHOLD:.2f} at the end")
    loads = f"{min(setup['loads']):g}-{max(setup['loads']):g}"
    return textwrap.fill(
        f"**Recommended configuration** (validation error {history[-1]:.4f} after "
        f"{len(history)} rounds, {stays}; rounds 1-{len(history)}: "
        f"{' '.join(f'{e:.4f}' for e in history)}; {results['wall_seconds']:.0f} s through "
        f"{setup['nodes']} local nodes with loads {loads} and {setup['load_delay']:g} s load "
        f"delays, as the demo runs it, on {machine['cores']} cores with load average "
        f"{machine['load_average_before']:g} before the run, {machine['measured']}; measured "
        f"and written here by `bench/recommended.py`, results in "
        f"`bench/results/recommended.json`):", width=92, break_on_hyphens=False) + "\n"


def write_readme(results: dict[str, Any], readme: Path = README) -> None:
    text = readme.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        raise SystemExit(f"{readme} has no recommended:begin/end markers")
    readme.write_text(BLOCK.sub(lambda m: m.group(1) + readme_paragraph(results) + m.group(3),
                                text), encoding="utf-8")


def readme_block(readme: Path = README) -> str:
    """The paragraph between the README's markers, as it stands."""
    match = BLOCK.search(readme.read_text(encoding="utf-8"))
    return match.group(2) if match else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-delay", type=float, default=3.0,
                        help="seconds of a simulated load delay (default 3, as the demo)")
    parser.add_argument("--write-readme", action="store_true",
                        help="rewrite the README's paragraph from the new measurement")
    parser.add_argument("--readme-only", action="store_true",
                        help="no run: rewrite the README from bench/results/recommended.json")
    args = parser.parse_args(argv)
    if args.readme_only:
        write_readme(json.loads(RESULTS.read_text(encoding="utf-8")))
        return 0
    results = measure(args.load_delay)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))
    if args.write_readme:
        write_readme(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
