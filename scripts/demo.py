"""The demo: 4 compute nodes (loads 0.2/0.4/0.6/0.8), a coordinator and the client on
this machine, training the letters MLP with the recommended configuration.

Everything it starts is stopped at the end, by PID, even on Ctrl-C.
    python scripts/demo.py [--policy 3] [--load-delay 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

LOADS = (0.2, 0.4, 0.6, 0.8)
RECOMMENDED = ["letters", "10", "5", "128", "0.005", "--hidden", "128,128", "--scale-features",
               "--local-optimizer", "adam", "--server-optimizer", "momentum",
               "--server-momentum", "0.5"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=int, default=3, choices=[1, 2, 3],
                        help="scheduling policy of the coordinator (default 3, adaptive)")
    parser.add_argument("--load-delay", default="3", help="seconds of a simulated load delay")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trainer-demo-") as tmp:
        workdir = Path(tmp)
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
