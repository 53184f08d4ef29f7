"""Command line of a compute node: `python compute_node.py <port> <load_prob> [options]`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys

from compute_node.handler import ComputeNodeHandler
from compute_node.load import LoadSimulator
from training.datapaths import DEFAULT_DATA_ROOT
from wire.generated import ComputeNode
from wire.launch import stop_on_signals, write_port_file
from wire.rpc import ThriftServer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compute_node.py",
        description="Run a compute node: it trains the work units a coordinator sends it.",
        epilog="Example: python compute_node.py 9091 0.2   (port 9091, load probability 0.2)",
    )
    parser.add_argument("port", type=int, help="TCP port to listen on (0 = any free port)")
    parser.add_argument("load_prob", type=_probability,
                        help="simulated load, 0..1: with the random policy (1) a unit is delayed "
                             "with this probability; with policies 2 and 3 it is first rejected "
                             "with this probability, and an accepted unit is still delayed with it")
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to bind (default 0.0.0.0: every interface; "
                             "127.0.0.1 keeps the node private to this machine)")
    parser.add_argument("--data-root", default=str(DEFAULT_DATA_ROOT),
                        help="folder holding the data sets; unit files are resolved under it "
                             "and paths that escape it are refused (default: %(default)s)")
    parser.add_argument("--load-delay", type=float, default=3.0,
                        help="seconds a delayed unit waits before it is trained (default 3)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the load simulation, for repeatable runs (default: random)")
    parser.add_argument("--node-id", default=None,
                        help="name in logs and results (default: <hostname>:<port>)")
    parser.add_argument("--device", default="cpu",
                        help="where torch models compute: cpu (default), cuda or cuda:N "
                             "(the letters MLP always runs in numpy on the CPU)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound port to this file once listening (for scripts)")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default INFO)")
    parser.add_argument("--crash-after-units", type=int, default=None, metavar="N",
                        help="fault injection for tests: exit abruptly on the unit after N")
    return parser


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"load probability must be between 0 and 1, got {text}")
    return value


def check_device(device: str) -> str | None:
    """Why `device` cannot be used here, or None. Loads torch only for a GPU device."""
    if device == "cpu":
        return None
    if not re.fullmatch(r"cuda(:\d+)?", device):
        return f"unknown device {device!r}; use cpu, cuda or cuda:N"
    import torch

    if not torch.cuda.is_available():
        return f"device {device!r} asked for, but torch sees no CUDA GPU on this machine"
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s node %(levelname)s %(message)s")
    if not os.path.isdir(args.data_root):
        print(f"error: data root {args.data_root} does not exist", file=sys.stderr)
        return 1
    device_problem = check_device(args.device)
    if device_problem:
        print(f"error: {device_problem}", file=sys.stderr)
        return 2
    load = LoadSimulator(args.load_prob, args.load_delay, seed=args.seed)
    handler = ComputeNodeHandler(args.node_id or "", args.data_root, load,
                                 args.crash_after_units, device=args.device)
    try:
        server = ThriftServer(ComputeNode.Processor(handler), args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    handler.node_id = node_id = args.node_id or f"{socket.gethostname()}:{server.port}"

    def shutdown() -> None:
        handler.cancel_all()  # delayed units answer at once, so the server drains quickly
        server.stop()

    stop_on_signals(shutdown)
    if args.port_file:
        write_port_file(args.port_file, server.port)
    print(f"compute node {node_id} listening on {args.host}:{server.port} "
          f"(load {args.load_prob}, delay {args.load_delay}s)", flush=True)
    server.serve_forever()
    print(f"compute node {node_id} stopped", flush=True)
    return 0
