"""A model of over 1 GiB of float32 parameters trains through real processes: 2 compute
nodes, a coordinator and the client on 127.0.0.1, 3 rounds of ``sync_sgd`` with the
coordinator's Adam (``--optimizer``: adam, adamw or sgd).

The model is a plug-in MLP (16 -> 16,384 -> 16,384 -> 26: 269.2 M parameters, 1.00 GiB),
the data a small synthetic table written for the run (1,024 training rows, 64 held out, in
the ``arrays`` format). Every round sends the weights to both nodes (one unit of 16 rows
each) and takes their gradients back: 4 GiB on the wire a round, in chunks. The
coordinator runs with ``--max-model-mb`` just above the model (its default admits 256 MiB);
nothing else needs raising. It also runs with ``--no-speculation``: a backup attempt of a
slow first unit (each node builds the model once, seconds for this one) would send the
weights twice more and hold two more results.

The table splits a round's seconds into what the nodes report:

* maths: a unit's ``compute_seconds`` (the node's forward and backward passes);
* transfer: the rest of a call as the coordinator times it (``busy_seconds`` less maths):
  weights down, the update up, encoding and decoding on both sides;
* coordinator: applying the averaged gradient and scoring the held-out rows
  (``update_seconds``);

and gives each process's peak resident memory (VmHWM; the client's from getrusage).

    python bench/big_model.py                 # minutes, about 9 GiB of memory in all
    python bench/big_model.py --width 8192    # a 256 MiB model, quicker
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

os.environ["OMP_NUM_THREADS"] = "1"  # inherited by every process

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools import local_cluster  # noqa: E402
from devtools.machine import describe  # noqa: E402

MODULE = textwrap.dedent('''
    from torch import nn


    def make_net(in_features, num_classes, width=16384):
        return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(),
                             nn.Linear(width, width), nn.ReLU(), nn.Linear(width, num_classes))
    ''')
FEATURES, CLASSES = 16, 26
MIB, GIB = 2**20, 2**30


def parameters(width: int) -> int:
    return (FEATURES + 1) * width + (width + 1) * width + (width + 1) * CLASSES


def write_data(root: Path, seed: int = 0) -> None:
    """A synthetic classification table: labels from a fixed random projection."""
    rng = np.random.default_rng(seed)
    projection = rng.normal(size=(FEATURES, CLASSES))
    folder = root / "synthetic"
    folder.mkdir(parents=True)
    for name, rows in (("train", 1024), ("validation", 64)):
        x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
        np.savez(folder / f"{name}.npz", x=x, y=np.argmax(x @ projection, axis=1))


def client_args(width: int, rounds: int, optimizer: str) -> list[str]:
    sets = {"run.model": "big_mlp:make_net", "run.model_args": json.dumps({"width": width}),
            "run.dataset": "synthetic", "data.format": "arrays", "run.algorithm": "sync_sgd",
            "run.rounds": rounds, "sync_sgd.images_per_work_unit": 16,
            "sync_sgd.units_per_iteration": 2, "sync_sgd.num_workunits_per_update": 2,
            "sync_sgd.batch_size": 16, "sync_sgd.optimizer": optimizer,
            "sync_sgd.lr": 0.01 if optimizer == "sgd" else 0.001}
    return [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]


def peak_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def run(width: int, rounds: int, optimizer: str, workdir: Path) -> dict:
    (workdir / "big_mlp.py").write_text(MODULE, encoding="utf-8")
    data_root = workdir / "data"
    write_data(data_root)
    common = ("--plugins", "big_mlp", "--data-root", str(data_root), "--log-level", "INFO")
    model_mb = parameters(width) * 4 / MIB
    nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, *common) for i in range(2)]
    procs = list(nodes)
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        coordinator = local_cluster.start_coordinator(
            workdir, nodes_file, 2, *common, "--max-model-mb", str(math.ceil(model_mb * 1.05)),
            "--deadline-floor", "600", "--no-speculation")
        procs.append(coordinator)
        began = time.monotonic()
        done = subprocess.run([sys.executable, str(REPO / "client.py"), "127.0.0.1",
                               str(coordinator.port), *client_args(width, rounds, optimizer),
                               "--json", "--quiet"], cwd=workdir,
                              env=local_cluster.python_env(), capture_output=True, text=True,
                              timeout=3600)
        wall = time.monotonic() - began
        if done.returncode != 0:
            raise RuntimeError(f"the run failed: {done.stderr}\n{coordinator.log()}")
        result = json.loads(done.stdout)
        peaks = {"coordinator": peak_bytes(coordinator.popen.pid),
                 **{f"node {i + 1}": peak_bytes(n.popen.pid) for i, n in enumerate(nodes)},
                 "client": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
    finally:
        for proc in reversed(procs):
            proc.stop()
    return {"result": result, "peaks": peaks, "wall": wall, "model_bytes": parameters(width) * 4}


def table(data: dict) -> str:
    result = data["result"]
    nodes = result["nodes"]
    units = sum(n["accepted"] for n in nodes)
    maths = sum(n["compute_seconds"] for n in nodes) / units
    transfer = sum(n["busy_seconds"] - n["compute_seconds"] - n["delay_seconds"]
                   for n in nodes) / units
    rounds = result["history"]
    lines = [f"model: {data['model_bytes'] / GIB:.2f} GiB of float32 parameters; "
             f"{result['rounds']} rounds in {data['wall']:.0f} s (client wall, set-up "
             "included); validation error "
             + ", ".join(f"{r['validation_error']:.3f}" for r in rounds),
             f"bytes down {result['bytes_down'] / GIB:.2f} GiB, up "
             f"{result['bytes_up'] / GIB:.2f} GiB",
             "",
             "| round | seconds | coordinator (update + scoring) |",
             "| ---: | ---: | ---: |"]
    lines += [f"| {r['round']} | {r['seconds']:.1f} | {r['update_seconds']:.1f} |"
              for r in rounds]
    lines += ["", "| per unit (2 a round, one on each node, in parallel) | seconds |",
              "| --- | ---: |",
              f"| transfer: weights down and gradient up, encoded and decoded | {transfer:.2f} |",
              f"| maths: the node's forward and backward passes | {maths:.2f} |",
              "", "| process | peak resident memory |", "| --- | ---: |"]
    lines += [f"| {name} | {peak / GIB:.2f} GiB |" for name, peak in data["peaks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=16384,
                        help="hidden width (default %(default)s: 1.00 GiB of parameters)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default %(default)s)")
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam",
                        help="the coordinator's optimizer (default %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="big_model_") as tmp:
        data = run(args.width, args.rounds, args.optimizer, Path(tmp))
    print(describe())
    print(table(data))


if __name__ == "__main__":
    main()
