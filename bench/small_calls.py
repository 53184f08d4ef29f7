"""Calls per second of small messages through the transport: a ping, and a unit whose
weights are one tensor of 64 KiB or 512 KiB (under the 1 MiB up to which a message is one
frame), echoed back by the node.

Small messages keep the single-frame path of stock framed Thrift; this measures that they
keep its speed too. ``--repo`` imports the transport from another checkout (an earlier
commit, say), so two trees are compared by the same script, run after run:

    python bench/small_calls.py                              # about 20 seconds
    python bench/small_calls.py --repo /tmp/earlier-checkout

The server runs in its own process on 127.0.0.1 (this script with ``--serve``); the client
is this process. Every figure is the median of ``--reps`` timed batches of ``--calls``.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIZES_KIB = (64, 512)


def _import_tree(repo: Path) -> None:
    sys.path.insert(0, str(repo))


def serve() -> None:
    from thrift_trainer.wire.generated import ComputeNode, ttypes
    from thrift_trainer.wire.rpc import ThriftServer

    class Echo:
        def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
            return ttypes.NodeInfo(request.protocol_version, "echo", 0.0, 0, 0, 0, 1.0)

        def train_with_weights(self, request: ttypes.WorkRequest) -> ttypes.TrainResult:
            return ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED,
                                      update=request.weights, num_samples=1, loss=0.0,
                                      error=0.0, compute_seconds=0.0, delay_seconds=0.0)

    server = ThriftServer(ComputeNode.Processor(Echo()))
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    print(f"PORT {server.port}", flush=True)
    server.serve_forever()


def measure(port: int, calls: int, reps: int) -> dict[str, float]:
    from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes
    from thrift_trainer.wire.rpc import connect
    from thrift_trainer.wire.tensor_codec import to_wire

    ping = ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)
    results = {}
    with connect(ComputeNode.Client, "127.0.0.1", port, read_timeout=60) as client:
        def rate(call) -> float:
            call()  # warm
            times = []
            for _ in range(reps):
                began = time.perf_counter()
                for _ in range(calls):
                    call()
                times.append(time.perf_counter() - began)
            return calls / statistics.median(times)

        results["ping"] = rate(lambda: client.ping(ping))
        for kib in SIZES_KIB:
            request = ttypes.WorkRequest(
                protocol_version=PROTOCOL_VERSION, run_id="r", round=1, unit_id="u",
                attempt=1, algorithm="delta_avg", model="mlp", dataset="d", unit_path="p",
                config_json="{}", scheduling_policy=1,
                weights=[to_wire("w", np.ones(kib * 256, dtype=np.float32))])
            results[f"{kib} KiB unit, echoed"] = rate(
                lambda request=request: client.train_with_weights(request))
    return results


def start_server(repo: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--repo", str(repo)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, int(line.split()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE.parent,
                        help="the checkout whose wire/ to measure (default: this one)")
    parser.add_argument("--calls", type=int, default=500, help="calls a batch (default 500)")
    parser.add_argument("--reps", type=int, default=5, help="timed batches (default 5)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _import_tree(args.repo.resolve())
    if args.serve:
        serve()
        return
    proc, port = start_server(args.repo.resolve())
    try:
        results = measure(port, args.calls, args.reps)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    print(f"wire/ of {args.repo.resolve()}")
    print("| call | calls/s |\n| --- | ---: |")
    for name, rate in results.items():
        print(f"| {name} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
