"""Several compute nodes in one process, each behind its own server on its own port.

A node that only trains the letters MLP needs numpy but never torch, yet one Python
process per node still costs tens of MiB; a soak test with dozens of nodes hosts them
in groups instead. Killing a group's process with SIGKILL takes all its nodes down at
once, like a machine dying, and starting it again with `--ports` brings the same nodes
back on the same addresses, where the coordinator's nodes file still lists them.

    python -m devtools.node_group --count 8 --port-file ports.txt [--data-root DIR]
    python -m devtools.node_group --ports 21001,21002 --port-file ports.txt

Once every server listens, the ports are written to the port file (one a line,
atomically) and a line "node group listening on HOST:P1,P2,..." is printed.
SIGTERM or SIGINT stops every node gracefully.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from thrift_trainer.compute_node.cli import startup_problem
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.training.data import paths
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.wire import security
from thrift_trainer.wire.generated import ComputeNode
from thrift_trainer.wire.launch import stop_on_signals
from thrift_trainer.wire.rpc import DRAIN_SECONDS, ThriftServer

BIND_RETRY_SECONDS = 0.1


@dataclass
class GroupNode:
    handler: ComputeNodeHandler
    server: ThriftServer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.node_group",
        description="Run several compute nodes in one process, each on its own port.")
    parser.add_argument("--count", type=int, default=None,
                        help="number of nodes, on free ports (or give --ports)")
    parser.add_argument("--ports", default=None, metavar="P1,P2,...",
                        help="listen on exactly these ports, one node each (to restart a "
                             "group on the addresses it had)")
    parser.add_argument("--port-file", required=True,
                        help="write the bound ports here, one a line, once all listen")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--load", type=float, default=0.0,
                        help="load probability of every node, 0..1 (default 0)")
    parser.add_argument("--load-delay", type=float, default=0.1,
                        help="seconds a delayed unit waits (default 0.1)")
    parser.add_argument("--seed", type=int, default=None,
                        help="load simulation seed; node i uses seed + i (default: random)")
    parser.add_argument("--data-root", default=str(DEFAULT_DATA_ROOT),
                        help="folder holding the data sets (default: %(default)s)")
    paths.add_argument(parser)  # --follow-data-links, as compute_node.py has it
    parser.add_argument("--bind-wait", type=float, default=10.0, metavar="SECONDS",
                        help="how long to retry a port that is still in use (default 10)")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default WARNING)")
    security.add_arguments(parser, serves=True)  # the same token/TLS flags as compute_node.py
    return parser


def wanted_ports(count: int | None, ports: str | None) -> list[int]:
    """The ports to bind (0 = any free port); ValueError when the arguments disagree."""
    if ports:
        parsed = [int(p) for p in ports.split(",") if p.strip()]
        if count is not None and count != len(parsed):
            raise ValueError(f"--count {count} but {len(parsed)} ports in --ports")
        if not parsed or any(not 0 < p < 65536 for p in parsed):
            raise ValueError(f"--ports must list ports in 1..65535, got {ports!r}")
        return parsed
    if count is None or count < 1:
        raise ValueError("give --count N (at least 1) or --ports")
    return [0] * count


def bind(host: str, port: int, handler: ComputeNodeHandler, wait: float) -> ThriftServer:
    """A server on host:port. A port a dead predecessor held may be briefly busy, so a
    fixed port is retried for up to `wait` seconds before the error is raised."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return ThriftServer(ComputeNode.Processor(handler), host, port)
        except OSError:
            if port == 0 or time.monotonic() >= deadline:
                raise
            time.sleep(BIND_RETRY_SECONDS)


def start_nodes(args: argparse.Namespace, ports: Sequence[int]) -> list[GroupNode]:
    """One handler and one listening server per port; on any failure none is left open."""
    nodes: list[GroupNode] = []
    try:
        for i, port in enumerate(ports):
            seed = None if args.seed is None else args.seed + i
            handler = ComputeNodeHandler("", args.data_root,
                                         LoadSimulator(args.load, args.load_delay, seed=seed))
            server = bind(args.host, port, handler, args.bind_wait)
            handler.node_id = f"{args.host}:{server.port}"
            nodes.append(GroupNode(handler, server))
    except BaseException:
        for node in nodes:
            node.server.stop()
            node.server.serve_forever()  # returns at once after stop(), closing the listener
        raise
    return nodes


def write_ports(path: str, ports: Sequence[int]) -> None:
    """Atomically, so a reader never sees half the list."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(f"{p}\n" for p in ports))
    os.replace(tmp, path)


def serve(nodes: list[GroupNode]) -> None:
    """Serve until SIGTERM/SIGINT, then stop every node and wait for their servers."""
    stopping = threading.Event()

    def shutdown() -> None:
        stopping.set()
        for node in nodes:
            node.handler.cancel_all()  # delayed units answer at once
            node.server.stop()

    stop_on_signals(shutdown)
    threads = [node.server.serve_in_thread() for node in nodes]
    while not stopping.wait(1.0):
        pass
    for thread in threads:
        thread.join(DRAIN_SECONDS + 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ports = wanted_ports(args.count, args.ports)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0.0 <= args.load <= 1.0 or args.load_delay < 0:
        parser.error("--load must be in 0..1 and --load-delay at least 0")
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s node-group %(levelname)s %(message)s")
    problem = startup_problem(args)
    if problem:
        print(f"error: {problem[0]}", file=sys.stderr)
        return problem[1]
    try:
        nodes = start_nodes(args, ports)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}: {exc}", file=sys.stderr)
        return 1
    bound = [node.server.port for node in nodes]
    write_ports(args.port_file, bound)
    print(f"node group listening on {args.host}:{','.join(map(str, bound))} "
          f"(load {args.load}, delay {args.load_delay}s)", flush=True)
    serve(nodes)
    print("node group stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
