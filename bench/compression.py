"""Compressed updates and weights on the letters recommended configuration, through the
real system: bytes up and down per round, validation error and wall time for each codec.

Each codec runs configs/letters_recommended.yaml (10 rounds, 11 units a round) on 4 local
compute nodes without simulated load, a coordinator and the client, all separate
processes on 127.0.0.1, in deterministic mode (results combined in unit order). Bytes are
the client's `bytes_up` / `bytes_down`: the training calls' frames, counted at the
coordinator's transport.

    python bench/compression.py [--quick] [--repeats 1] [--rounds 10] [--json out.json]
                                [--codecs "up topk 1%; up topk 1%, warm-up 4"]

With ``--dcgan-updates U`` it also trains DCGAN-28 on MNIST by sync SGD (K = 3 of 4 units of
32 images, 4 nodes) for U updates without compression and with fp16 both ways, and scores
each generator's FID (n = 2,000, the project's frozen classifier) after the same updates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

RECIPE = local_cluster.REPO / "configs" / "letters_recommended.yaml"
NODES = 4
# (label, compression settings)
CODECS: list[tuple[str, dict[str, object]]] = [
    ("none", {}),
    ("up fp16", {"up": "fp16"}),
    ("up int8", {"up": "int8"}),
    ("up topk 1%", {"up": "topk", "topk_fraction": 0.01}),
    ("up topk 5%", {"up": "topk", "topk_fraction": 0.05}),
    ("up topk 1%, warm-up 4", {"up": "topk", "topk_fraction": 0.01, "topk_warmup_rounds": 4}),
    ("up topk 5%, warm-up 4", {"up": "topk", "topk_fraction": 0.05, "topk_warmup_rounds": 4}),
    ("up fp16, down fp16", {"up": "fp16", "down": "fp16"}),
]
QUICK_CODECS = {"none", "up fp16", "up int8", "up topk 1%"}


def run_once(settings: dict[str, object], rounds: int, seed: int, workdir: Path) -> dict:
    nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, "--seed", str(seed * 10 + i),
                                      "--log-level", "WARNING") for i in range(NODES)]
    coordinator = None
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 2, "--seed",
                                                      str(seed), "--log-level", "WARNING")
        sets = [f"run.rounds={rounds}", "run.deterministic=true"]
        result, measured = train(coordinator, RECIPE, sets, settings, workdir, timeout=1800)
        return {**measured, "error": result["validation_error"]}
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def train(coordinator: local_cluster.Proc, config: Path, sets: list[str],
          settings: dict[str, object], workdir: Path, timeout: float) -> tuple[dict, dict]:
    """One client run of ``config`` with ``sets`` and the compression ``settings``: its JSON
    result, and its wall time and bytes up and down per round."""
    sets = [*sets, *(f"compression.{k}={v}" for k, v in settings.items())]
    args = ["127.0.0.1", str(coordinator.port), "--config", str(config),
            *(x for s in sets for x in ("--set", s)), "--json", "--quiet"]
    started = time.monotonic()
    done = local_cluster.run_client(args, workdir, timeout=timeout)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{config.name} {settings} failed: {done.stderr}")
    result = json.loads(done.stdout)
    return result, {"wall": wall, "up_per_round": result["bytes_up"] / result["rounds"],
                    "down_per_round": result["bytes_down"] / result["rounds"]}


def dcgan_once(settings: dict[str, object], updates: int, workdir: Path) -> dict:
    """One DCGAN-28 sync SGD run of ``updates`` iterations: FID, bytes, wall time."""
    nodes = [local_cluster.start_node(workdir, f"gan{i}", 0.0, "--log-level", "WARNING")
             for i in range(NODES)]
    coordinator = None
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "gan-nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 3, "--log-level",
                                                      "WARNING", "--deterministic")
        sets = [f"run.rounds={updates}", "run.model=dcgan28", "sync_sgd.images_per_work_unit=32",
                "sync_sgd.num_workunits_per_update=3", "sync_sgd.units_per_iteration=4",
                f"outputs.eval_every={updates}", f"outputs.sample_every={updates}",
                f"outputs.checkpoint_every={updates}", "outputs.eval_n=2000"]
        config = local_cluster.REPO / "configs" / "dcgan_mnist.yaml"
        result, measured = train(coordinator, config, sets, settings, workdir, timeout=7200)
        return {**measured, "fid": result["history"][-1]["fid_features"]}
    finally:
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def dcgan_table(results: list[tuple[str, dict]], updates: int) -> str:
    base = results[0][1]
    rows = [f"| DCGAN-28, {updates} updates | bytes up / round | bytes down / round | "
            "FID (n = 2,000) | vs none | wall s |", "|---|---|---|---|---|---|"]
    for label, m in results:
        rows.append(f"| {label} | {m['up_per_round'] / 1e6:.3f} MB | "
                    f"{m['down_per_round'] / 1e6:.3f} MB | {m['fid']:.2f} | "
                    f"{(m['fid'] / base['fid'] - 1) * 100:+.1f} % | {m['wall']:.1f} |")
    return "\n".join(rows)


def measure(settings: dict[str, object], rounds: int, repeats: int, workdir: Path) -> dict:
    runs = [run_once(settings, rounds, seed, workdir) for seed in range(1, repeats + 1)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def table(results: list[tuple[str, dict]]) -> str:
    base = results[0][1]
    rows = ["| codec | bytes up / round | up vs none | bytes down / round | "
            "validation error | vs none | wall s |",
            "|---|---|---|---|---|---|---|"]
    for label, m in results:
        rows.append(
            f"| {label} | {m['up_per_round'] / 1e6:.3f} MB | "
            f"{base['up_per_round'] / m['up_per_round']:.1f}x fewer | "
            f"{m['down_per_round'] / 1e6:.3f} MB | {m['error']:.4f} | "
            f"{m['error'] - base['error']:+.4f} | {m['wall']:.1f} |")
    return "\n".join(rows)


def chosen(labels: str | None, quick: bool) -> list[tuple[str, dict[str, object]]]:
    """The codecs to run: ``labels`` (';'-separated) with none first, else all of them
    (the quick set with ``quick``); SystemExit names an unknown label."""
    if labels is None:
        return [c for c in CODECS if not quick or c[0] in QUICK_CODECS]
    wanted = {"none", *(label.strip() for label in labels.split(";") if label.strip())}
    unknown = sorted(wanted - {label for label, _ in CODECS})
    if unknown:
        raise SystemExit(f"unknown codec label {unknown[0]!r}; known: "
                         + "; ".join(label for label, _ in CODECS))
    return [c for c in CODECS if c[0] in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, one run each, codecs none/fp16/int8/topk 1%% only")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per run (default 10)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per codec, seeds 1..N (median; default 1)")
    parser.add_argument("--codecs", default=None, metavar="LABELS",
                        help="only these codecs, by label, separated by ';' (none always "
                             "runs first, as the base); labels: "
                             + "; ".join(label for label, _ in CODECS).replace("%", "%%"))
    parser.add_argument("--json", default=None, help="also write the medians to this file")
    parser.add_argument("--dcgan-updates", type=int, default=0, metavar="U",
                        help="also DCGAN-28 sync SGD for U updates, none against fp16 both "
                             "ways (default 0: skip; 600 as docs/benchmarks.md)")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    codecs = chosen(args.codecs, args.quick)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        for label, settings in codecs:
            m = measure(settings, rounds, 1 if args.quick else args.repeats, Path(tmp))
            print(f"{label}: error {m['error']:.4f}, up {m['up_per_round']:.0f} B/round, "
                  f"{m['wall']:.1f}s", file=sys.stderr, flush=True)
            results.append((label, m))
        gans = []
        for label, settings in ([("none", {}), ("fp16 both ways", {"up": "fp16", "down": "fp16"})]
                                if args.dcgan_updates > 0 else []):
            m = dcgan_once(settings, args.dcgan_updates, Path(tmp))
            print(f"DCGAN {label}: FID {m['fid']:.2f}, {m['wall']:.1f}s", file=sys.stderr,
                  flush=True)
            gans.append((label, m))
    print(table(results))
    if gans:
        print()
        print(dcgan_table(gans, args.dcgan_updates))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"letters": [{"codec": label, **m} for label, m in results],
             "dcgan": [{"codec": label, **m} for label, m in gans]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
