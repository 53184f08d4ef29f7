"""What the dashboard costs a run: the letters recommended configuration's wall time with
no dashboard, and with the dashboard served and polled as open pages and a scraper poll it.

Each repeat runs configs/letters_recommended.yaml (10 rounds, 11 units a round) on 4 local
compute nodes without simulated load, a coordinator and the client, all separate
processes on 127.0.0.1, once per mode, alternating. "polled" starts the coordinator with
`--dashboard-port 0` and, while the run trains, requests the run's page data
(/api/runs/<run>) as `--pages` open pages would (each once a second, as the page does),
the runs list once a second and /metrics once a second. Wall time is the client's
`wall_seconds` (the coordinator's, from the run's start to its end); CPU is the
coordinator process's user + system time from its start to the run's end (Linux /proc).

    python bench/dashboard_cost.py [--repeats 3] [--pages 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools import local_cluster  # noqa: E402

RECIPE = local_cluster.REPO / "configs" / "letters_recommended.yaml"
NODES = 4


def poll(url: str, every: float, stop: threading.Event, counts: list[int]) -> None:
    """GET `url` every `every` seconds until `stop`; counts answers (any status)."""
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
        except OSError:
            continue
        counts.append(1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(mode: str, run_id: str, pages: int, workdir: Path) -> dict:
    nodes = [local_cluster.start_node(workdir, f"node{i}", 0.0, "--log-level", "WARNING")
             for i in range(NODES)]
    coordinator = None
    stop, counts, pollers = threading.Event(), [], []
    try:
        nodes_file = local_cluster.write_nodes_file(workdir / "nodes.txt", nodes)
        extra = ["--dashboard-port", "0"] if mode == "polled" else []
        coordinator = local_cluster.start_coordinator(workdir, nodes_file, 2, "--log-level",
                                                      "WARNING", *extra)
        if mode == "polled":
            base = coordinator.wait_for(r"dashboard at (http://\S+/)").group(1)
            urls = [f"{base}api/runs/{run_id}"] * pages + [f"{base}api/runs", f"{base}metrics"]
            for url in urls:
                thread = threading.Thread(target=poll, args=(url, 1.0, stop, counts),
                                          daemon=True)
                thread.start()
                pollers.append(thread)
        done = local_cluster.run_client(
            ["127.0.0.1", str(coordinator.port), "--config", str(RECIPE), "--run-id", run_id,
             "--quiet", "--json"], workdir, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        cpu = cpu_seconds(coordinator.popen.pid)
        result = json.loads(done.stdout)
        return {"mode": mode, "wall_seconds": result["wall_seconds"], "cpu_seconds": cpu,
                "error": result["validation_error"], "requests": len(counts)}
    finally:
        stop.set()
        for thread in pollers:
            thread.join(15)
        for proc in [coordinator, *nodes]:
            if proc is not None:
                proc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pages", type=int, default=4, help="open run pages simulated")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("off", "polled"):
                workdir = Path(tmp) / f"{mode}{repeat}"
                workdir.mkdir()
                started = time.monotonic()
                results.append(run_once(mode, f"{mode}{repeat}", args.pages, workdir))
                print(f"{mode:7s} repeat {repeat + 1}: wall {results[-1]['wall_seconds']:.2f} s, "
                      f"coordinator CPU {results[-1]['cpu_seconds']:.2f} s, "
                      f"error {results[-1]['error']:.4f}, {results[-1]['requests']} requests "
                      f"({time.monotonic() - started:.0f} s with start-up)", flush=True)
    for mode in ("off", "polled"):
        walls = [r["wall_seconds"] for r in results if r["mode"] == mode]
        cpus = [r["cpu_seconds"] for r in results if r["mode"] == mode]
        print(f"{mode:7s} median wall {statistics.median(walls):.2f} s "
              f"(min {min(walls):.2f}, max {max(walls):.2f}), median coordinator CPU "
              f"{statistics.median(cpus):.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
