"""What the PostgreSQL run store costs a run: seconds per round against SQLite.

Two workloads, each run on both stores in turn (SQLite, PostgreSQL, SQLite, ... --reps
times each), so that both see the same machine:

- letters: the recommended letters recipe (configs/letters_recommended.yaml) on two compute
  nodes, one coordinator; seconds per round = the run's wall time / its rounds;
- soak: bench/soak.py with --nodes 48 (its kills included), where the coordinator's own
  overheads, the store's writes among them, set the pace; seconds per round likewise.

The PostgreSQL server is a throwaway one on this machine (devtools/postgres_cluster.py),
a fresh database per run. Target: PostgreSQL <= 1.2x SQLite.

Usage: python bench/store_cost.py [--reps 3] [--soak-rounds 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from devtools import local_cluster as procs  # noqa: E402
from devtools.postgres_cluster import PostgresCluster  # noqa: E402

RECIPE = str(REPO / "configs" / "letters_recommended.yaml")
TARGET = 1.2


class Stores:
    """SQLite in a folder of its own, or a fresh PostgreSQL database, per run."""

    def __init__(self, server: PostgresCluster) -> None:
        self.server = server
        self.made = 0

    def store(self, kind: str, folder: Path) -> str:
        self.made += 1
        if kind == "sqlite":
            return str(folder / f"runs-{self.made}.db")
        name = f"cost_{self.made}"
        with psycopg.connect(self.server.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.server.url.rsplit("/", 1)[0] + f"/{name}"


def letters_round(stores: Stores, kind: str, workdir: Path, nodes_file: Path) -> float:
    store = stores.store(kind, workdir)
    coordinator = procs.start_coordinator(workdir, nodes_file, 2, "--store", store,
                                          name=f"coordinator-{stores.made}")
    try:
        done = procs.run_client(["127.0.0.1", str(coordinator.port), "--config", RECIPE,
                                 "--run-id", f"run-{stores.made}", "--json"], workdir,
                                timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"letters on {kind} failed: {done.stderr}")
        result = json.loads(done.stdout)
        return result["wall_seconds"] / result["rounds"]
    finally:
        coordinator.stop()


def soak_round(stores: Stores, kind: str, workdir: Path, rounds: int) -> float:
    store = stores.store(kind, workdir)
    out = workdir / f"soak-{stores.made}.json"
    command = [sys.executable, str(REPO / "bench" / "soak.py"), "--nodes", "48", "--rounds",
               str(rounds), "--kill-every", "2", "--seed", "1", "--json", str(out)]
    if kind == "postgresql":
        command += ["--store-url", store]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the soak on {kind} failed:\n{done.stdout[-2000:]}")
    totals = json.loads(out.read_text())["totals"]
    return totals["wall_seconds"] / totals["rounds"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per store and workload")
    parser.add_argument("--soak-rounds", type=int, default=100)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    seconds: dict[str, dict[str, list[float]]] = {"letters": {}, "soak": {}}
    with tempfile.TemporaryDirectory(prefix="store-cost-") as tmp, PostgresCluster() as pg:
        workdir, stores = Path(tmp), Stores(pg)
        nodes = [procs.start_node(workdir, f"node{i}", 0.0, "--seed", str(i)) for i in (1, 2)]
        nodes_file = procs.write_nodes_file(workdir / "compute_nodes.txt", nodes)
        try:
            for _ in range(args.reps):
                for kind in ("sqlite", "postgresql"):
                    seconds["letters"].setdefault(kind, []).append(
                        letters_round(stores, kind, workdir, nodes_file))
                    seconds["soak"].setdefault(kind, []).append(
                        soak_round(stores, kind, workdir, args.soak_rounds))
                    print(f"{kind}: letters {seconds['letters'][kind][-1]:.3f} s/round, soak "
                          f"{seconds['soak'][kind][-1]:.3f} s/round", flush=True)
        finally:
            for node in nodes:
                node.stop()
    ok = True
    for workload, by_store in seconds.items():
        sqlite, postgres = (statistics.median(by_store[k]) for k in ("sqlite", "postgresql"))
        ratio = postgres / sqlite
        ok = ok and ratio <= TARGET
        print(f"{workload}: SQLite {sqlite:.3f} s/round, PostgreSQL {postgres:.3f} s/round "
              f"(medians of {args.reps}): {ratio:.2f}x (target <= {TARGET}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(seconds, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
