"""The demo: 4 compute nodes (loads 0.2/0.4/0.6/0.8), a coordinator and the client on
this machine, training the letters MLP with the recommended configuration.

Everything it starts is stopped at the end, by PID, even on Ctrl-C. What they wrote stays
in demo-runs/<time>/ under the repository (ignored by git): the processes' logs, the
coordinator's run folder (metrics.jsonl, curves.png, model.npz) and the run store.
    python scripts/demo.py [--policy 3] [--load-delay 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

LOADS = (0.2, 0.4, 0.6, 0.8)
DEMO_ROOT = "demo-runs"  # under the repository, in .gitignore
RECOMMENDED = ["letters", "10", "5", "128", "0.005", "--hidden", "128,128", "--scale-features",
               "--local-optimizer", "adam", "--server-optimizer", "momentum",
               "--server-momentum", "0.5"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=int, default=3, choices=[1, 2, 3],
                        help="scheduling policy of the coordinator (default 3, adaptive)")
    parser.add_argument("--load-delay", default="3", help="seconds of a simulated load delay")
    args = parser.parse_args(argv)
    workdir = demo_folder(local_cluster.REPO / DEMO_ROOT)
    print(f"demo folder: {workdir}")
    try:
        return _run(workdir, args)
    finally:
        for line in where_outputs_are(workdir):
            print(line)


def demo_folder(root: Path, now: float | None = None) -> Path:
    """A new folder for this demo's files, named by the time it started."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    folder, n = root / stamp, 1
    while folder.exists():  # two demos within a second
        n += 1
        folder = root / f"{stamp}-{n}"
    folder.mkdir(parents=True)
    return folder


def where_outputs_are(workdir: Path) -> list[str]:
    """Lines telling where the run's folder and curves are, as far as they were written."""
    run_dirs = sorted(p for p in (workdir / "runs").glob("*") if p.is_dir())
    if not run_dirs:
        return [f"no run folder was written; logs are in {workdir}"]
    lines = [f"run folder (kept): {run_dirs[-1]}"]
    curves = run_dirs[-1] / "curves.png"
    lines.append(f"curves: {curves}" if curves.exists() else
                 "curves: not written (the run did not finish)")
    return lines


def _run(workdir: Path, args: argparse.Namespace) -> int:
    procs: list[local_cluster.Proc] = []
    try:
        for i, load in enumerate(LOADS):
            procs.append(local_cluster.start_node(workdir, f"node{i + 1}", load,
                                                  "--load-delay", args.load_delay))
            print(f"compute node {i + 1}: port {procs[-1].port}, load {load}")
        nodes_file = local_cluster.write_nodes_file(workdir / "compute_nodes.txt", procs)
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, args.policy)
        procs.append(coordinator)
        print(f"coordinator: port {coordinator.port}, policy {args.policy}")
        command = [sys.executable, str(local_cluster.REPO / "client.py"), "127.0.0.1",
                   str(coordinator.port), *RECOMMENDED, "--out", str(Path.cwd() / "models")]
        print("client:", " ".join(["python client.py", *command[2:]]), flush=True)
        return subprocess.run(command, env=local_cluster.python_env()).returncode
    finally:
        for proc in reversed(procs):
            proc.stop()
        print("stopped the demo's nodes and coordinator")


if __name__ == "__main__":
    sys.exit(main())
