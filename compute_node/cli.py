"""Command line of a compute node: `python compute_node.py <port> <load_prob> [options]`."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from typing import Any

from thrift_trainer.compute_node.coordinator_link import (
    CoordinatorLink,
    PullSettings,
    PullStopped,
    PullWorker,
)
from thrift_trainer.compute_node.faults import CORRUPTIONS, FaultPlan, with_faults
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.compute_node.load import LoadSimulator
from thrift_trainer.compute_node.local_workers import WorkerLost, attach, check_workers, exit_status
from thrift_trainer.compute_node.threads import limit_threads
from thrift_trainer.compute_node.warm_up import warm_up_problem
from thrift_trainer.training import plugins
from thrift_trainer.training.clients.held import HeldClients
from thrift_trainer.training.data import paths
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.wire import arg_types, security
from thrift_trainer.wire.generated import ComputeNode
from thrift_trainer.wire.launch import stop_on_signals, warn_if_exposed, write_port_file
from thrift_trainer.wire.log_limit import add_log_level_argument, setup_logging
from thrift_trainer.wire.rpc import ThriftServer


def build_parser(pull: bool = False) -> argparse.ArgumentParser:
    """Push form: `<port> <load_prob>`; pull form: `--pull HOST:PORT <load_prob>`."""
    parser = argparse.ArgumentParser(
        prog=arg_types.command_name("compute_node.py"),
        description="Run a compute node: it trains the work units a coordinator sends it. "
                    "A node that cannot accept connections (behind NAT, in a notebook) "
                    "dials out instead with --pull HOST:PORT and leases units.",
        epilog="Examples: python compute_node.py 9091 0.2   (port 9091, load probability 0.2); "
               "python compute_node.py --pull coord.example.org:9095 0.2",
    )
    parser.add_argument("--pull", default=None, metavar="HOST:PORT", type=_host_ports,
                        help="pull mode: register with the coordinator at HOST:PORT, lease "
                             "units from it and heartbeat; no port is opened. A leader and "
                             "its standbys as a comma-separated list (h1:9095,h2:9095): the "
                             "node works for whichever leads")
    parser.add_argument("--register", default=None, metavar="HOST:PORT", type=_host_ports,
                        help="announce this node to the coordinator at HOST:PORT (no line in "
                             "its compute_nodes.txt needed), heartbeat, and leave on stop; a "
                             "comma-separated list as for --pull")
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help="with --register: the address the coordinator should call "
                             "(default: --host, or this machine's name when binding 0.0.0.0)")
    parser.add_argument("--retry-for", type=arg_types.seconds, default=300.0, metavar="SECONDS",
                        help="--pull and --register: give up after the coordinator has been "
                             "unreachable this long (default 300)")
    if not pull:
        parser.add_argument("port", type=arg_types.listen_port,
                            help="TCP port to listen on (0 = any free port; not in pull mode)")
    parser.add_argument("load_prob", type=arg_types.probability,
                        help="simulated load, 0..1: with the random policy (1) a unit is delayed "
                             "with this probability; with policies 2 and 3 it is first rejected "
                             "with this probability, and an accepted unit is still delayed with it")
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to bind (default 0.0.0.0: every interface; "
                             "127.0.0.1 keeps the node private to this machine)")
    parser.add_argument("--data-root", default=str(DEFAULT_DATA_ROOT),
                        help="folder holding the data sets; unit files are resolved under it "
                             "and paths that escape it are refused (default: %(default)s)")
    paths.add_argument(parser)
    parser.add_argument("--clients", type=_held_clients, default=None, metavar="INDICES",
                        help="the federated clients whose data this node holds, e.g. 0-49 or "
                             "0-9,20-29: units of a run's other clients never come here "
                             "(default: every client; docs/federated-data.md)")
    parser.add_argument("--private-label-counts", action="store_true",
                        help="with node-resident clients (clients.placement nodes): announce "
                             "only the size of this node's data at a run's check, not how "
                             "many examples of each label it holds")
    parser.add_argument("--load-delay", type=arg_types.non_negative_seconds, default=3.0,
                        help="seconds a delayed unit waits before it is trained (default 3)")
    parser.add_argument("--seed", type=arg_types.seed, default=None,
                        help="seed of the load simulation, for repeatable runs (default: random)")
    parser.add_argument("--node-id", default=None,
                        help="name in logs and results (default: <hostname>:<port>)")
    parser.add_argument("--device", default="cpu",
                        help="where torch models compute: cpu (default), cuda or cuda:N "
                             "(the letters MLP always runs in numpy on the CPU)")
    parser.add_argument("--threads", type=arg_types.positive_int, default=None, metavar="N",
                        help="threads of the node's maths (BLAS, torch); default: "
                             "OMP_NUM_THREADS when set, else 1 (a node computes one unit at "
                             "a time)")
    parser.add_argument("--workers", type=arg_types.positive_int, default=1, metavar="W",
                        help="local worker processes (default 1: the node computes itself): "
                             "started once, a torch.distributed group on this machine (gloo "
                             "with --device cpu; NCCL with --device cuda, worker r on cuda:r); "
                             "each unit of sync_sgd, delta_avg or fl_gan is split between "
                             "them and their results averaged into one; at most one worker "
                             "per core (or GPU); --threads applies to each worker")
    parser.add_argument("--warm-up", default=None, metavar="MODEL",
                        help="load torch and build MODEL (e.g. dcgan28) in the background at "
                             "start, before a run asks for it; pings are answered meanwhile "
                             "(a coordinator asks nodes to warm up before a torch run's "
                             "first round anyway)")
    parser.add_argument("--port-file", default=None,
                        help="write the bound port to this file once listening (for scripts)")
    add_log_level_argument(parser)
    plugins.add_arguments(parser)
    parser.add_argument("--crash-after-units", type=arg_types.non_negative_int,
                        default=None, metavar="N",
                        help="fault injection for tests: exit abruptly on the unit after N")
    parser.add_argument("--hang-after-units", type=arg_types.non_negative_int,
                        default=None, metavar="N",
                        help="fault injection for tests: from the unit after N, accept units "
                             "and never answer them (pings still answer)")
    parser.add_argument("--corrupt-updates", choices=CORRUPTIONS, default=None,
                        help="fault injection for tests: spoil updates (NaN values, a wrong "
                             "shape, or a norm a million times too large), their sample "
                             "counts (0, or 10^15), or send Byzantine updates (signflip: "
                             "times -10, scaled: times 100, random: noise of their norm)")
    parser.add_argument("--corrupt-after-units", type=arg_types.non_negative_int,
                        default=0, metavar="N",
                        help="with --corrupt-updates: only from the unit after N (default 0)")
    parser.add_argument("--slowdown", type=arg_types.factor, default=1.0, metavar="F",
                        help="fault injection for tests: every unit takes F times as long as "
                             "its maths, like a slower machine (default 1: no slowdown)")
    if not pull:
        relay = parser.add_argument_group(
            "relay", "A relay serves units like a node but computes them on the nodes of "
                     "its own nodes file (which may be relays too): see docs/deployment.md.")
        relay.add_argument("--relay", default=None, metavar="NODES_FILE",
                           help="be a relay over the nodes this file lists (one host,port "
                                "per line, as compute_nodes.txt; re-read as it changes)")
        relay.add_argument("--members-port", type=arg_types.int_range(0, 65535), default=None,
                           metavar="PORT",
                           help="also listen on PORT (0: any free one) for members that join "
                                "the relay's group themselves: pull nodes (--pull HOST:PORT) "
                                "and push nodes that --register")
        relay.add_argument("--relay-policy", type=arg_types.int_range(1, 3), choices=[1, 2, 3],
                           default=2,
                           help="scheduling policy of the relay over its nodes (default 2)")
        parser.add_argument("--link-delay-ms", type=arg_types.non_negative_seconds,
                            default=0.0, metavar="MS",
                            help="experiments: hold every reply to a unit this many "
                                 "milliseconds, as a slow link between sites (default 0)")
    security.add_arguments(parser, serves=True)
    return parser


def apply_threads(threads: int | None) -> str:
    """Set the node's thread count (compute_node.py did it before numpy loaded; this also
    covers a torch already loaded) and describe it, e.g. '1 thread'."""
    count = limit_threads(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    return f"{count} thread{'s' if count > 1 else ''}"


def _held_clients(text: str) -> HeldClients:
    try:
        return HeldClients.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_ports(text: str) -> list[tuple[str, int]]:
    """HOST:PORT, or several of them separated by commas."""
    addresses = []
    for part in text.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
        addresses.append((host, int(port)))
    return addresses


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


def startup_problem(args: argparse.Namespace) -> tuple[str, int] | None:
    """Why a node cannot start with these arguments (message, exit code), or None; sets
    up the process's token and TLS when it can."""
    if not os.path.isdir(args.data_root):
        return f"data root {args.data_root} does not exist", 1
    paths.follow_links(args.follow_data_links)
    if getattr(args, "members_port", None) is not None and args.relay is None:
        return "--members-port is for a relay's members: give --relay NODES_FILE too", 2
    security_problem = security.configure_from_args(args, serves=True)
    if security_problem:
        return security_problem, 2
    return None


def _role(args: argparse.Namespace) -> str:
    """What this process is, in the lines of what it refuses."""
    if getattr(args, "relay", None) is not None:
        return "relay"
    return "pull node" if getattr(args, "pull", None) else "node"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pull = any(a == "--pull" or a.startswith("--pull=") for a in argv)
    args = build_parser(pull).parse_args(argv)
    setup_logging(args.log_level, "%(asctime)s node %(levelname)s %(message)s")
    problem = startup_problem(args)
    if problem:
        print(f"error: {problem[0]}", file=sys.stderr)
        return problem[1]
    plugin_problem = plugins.allow_from_args(args, _role(args))
    if plugin_problem:
        print(f"error: {plugin_problem}", file=sys.stderr)
        return 2
    warm_up = args.warm_up and warm_up_problem(args.warm_up)  # after the plug-ins it may name
    if warm_up:
        print(f"error: --warm-up: {warm_up}", file=sys.stderr)
        return 2
    device_problem = check_device(args.device) or check_workers(args.workers, args.device,
                                                              getattr(args, "relay", None))
    if device_problem:
        print(f"error: {device_problem}", file=sys.stderr)
        return 2
    threads = apply_threads(args.threads)
    load = LoadSimulator(args.load_prob, args.load_delay, seed=args.seed)
    relay = getattr(args, "relay", None)
    plain = ComputeNodeHandler(args.node_id or "", args.data_root, load, device=args.device) \
        if relay is None else _relay_handler(args, load)
    plain.link_delay = getattr(args, "link_delay_ms", 0.0) / 1000
    plain.held_clients = args.clients
    plain.private_label_counts = args.private_label_counts
    try:
        workers = attach(plain, args.workers, args.device)  # before faults: they wrap it
    except WorkerLost as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if workers:
        threads += f", {workers.describe()}"
        plain.role = f"{args.workers} local workers"
    handler = with_faults(plain, FaultPlan(
        args.crash_after_units, args.hang_after_units, args.corrupt_updates,
        args.corrupt_after_units, args.seed, args.slowdown))
    if args.warm_up:
        handler.warm_up.start(args.warm_up)  # a background thread: serving starts at once
    if args.pull:
        return exit_status(workers, run_pull(handler, args, threads))
    try:
        server = ThriftServer(ComputeNode.Processor(handler), args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return exit_status(workers, 1)
    handler.node_id = node_id = args.node_id or f"{socket.gethostname()}:{server.port}"
    members_server = None
    if relay is not None:
        members = _start_relay(plain, args.host, server.port)
        if members is None:
            server.stop()
            return 1
        threads += f", relay over {members} nodes of {relay}"
        if args.members_port is not None:
            members_server = _members_server(plain, args.host, args.members_port)
            if members_server is None:
                plain.relay.close()
                server.stop()
                return 1
            threads += f", members join on port {members_server.port}"

    link = None
    if args.register:
        link = _register(handler, args, server.port)
        if link is None:
            server.stop()
            return exit_status(workers, 1)

    def shutdown() -> None:
        handler.cancel_all()  # delayed units answer at once, so the server drains quickly
        if link is not None:
            link.stop()
        if relay is not None:
            plain.relay.close()
        if members_server is not None:
            members_server.stop()
        server.stop()

    stop_on_signals(shutdown)
    if args.port_file:
        write_port_file(args.port_file, server.port)
    warn_if_exposed([(args.host, s.port) for s in (server, members_server) if s is not None])
    print(f"compute node {node_id} listening on {args.host}:{server.port} "
          f"(load {args.load_prob}, delay {args.load_delay}s, {threads})", flush=True)
    server.serve_forever()
    print(f"compute node {node_id} stopped", flush=True)
    return exit_status(workers, 0)


def _relay_handler(args: argparse.Namespace, load: LoadSimulator) -> ComputeNodeHandler:
    """A relay's handler (its modules, the coordinator's engine among them, are loaded only
    by relays)."""
    from thrift_trainer.compute_node.relay import RelayHandler, RelayRunner
    from thrift_trainer.engine.nodes.nodes_file import NodesFile

    runner = RelayRunner(NodesFile(args.relay, role="relay"), args.relay_policy, seed=args.seed)
    return RelayHandler(args.node_id or "", args.data_root, load, runner)


def _start_relay(handler: Any, host: str, port: int) -> int | None:
    """Read the relay's group once it listens (so a line naming the relay itself is
    refused); its member count, or None after saying why it cannot be used."""
    from thrift_trainer.engine.nodes.nodes_file import NodesFileError

    handler.relay.nodes_file.serve_at(host, port)
    try:
        return handler.start_relay()
    except NodesFileError as exc:
        print(f"error: relay nodes file: {exc}", file=sys.stderr)
        return None


def _members_server(handler: Any, host: str, port: int) -> ThriftServer | None:
    """The relay's members port, serving in a thread; None (after saying why) when it
    cannot listen."""
    from thrift_trainer.compute_node.relay_members import RelayMembersHandler
    from thrift_trainer.wire.generated import Coordinator

    members = RelayMembersHandler(handler.node_id, handler.relay.membership, handler.ping)
    try:
        server = ThriftServer(Coordinator.Processor(members), host, port)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port} for members: {exc.strerror}",
              file=sys.stderr)
        return None
    server.serve_in_thread()
    return server


def _register(handler: ComputeNodeHandler, args: argparse.Namespace,
              port: int) -> CoordinatorLink | None:
    """Announce this push node to the coordinator; None (after saying why) if refused."""
    (host, coordinator_port), *more = args.register
    advertise = args.advertise or (args.host if args.host not in ("0.0.0.0", "::", "")
                                   else socket.gethostname())
    link = CoordinatorLink(handler, PullSettings(
        host, coordinator_port, handler.node_id, args.load_prob, args.device,
        retry_for=args.retry_for, listen_host=advertise, listen_port=port, more=tuple(more)))
    try:
        link.start()
    except PullStopped as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return link


def run_pull(handler: ComputeNodeHandler, args: argparse.Namespace, threads: str) -> int:
    """Pull mode: lease units from the coordinator until a signal or a refusal."""
    (host, port), *more = args.pull
    handler.node_id = args.node_id or f"{socket.gethostname()}-{os.getpid()}"
    held = getattr(args, "clients", None)
    worker = PullWorker(handler, PullSettings(host, port, handler.node_id, args.load_prob,
                                              args.device, retry_for=args.retry_for,
                                              more=tuple(more),
                                              clients=str(held) if held else None))

    def shutdown() -> None:
        handler.cancel_all()
        worker.stopped.set()

    stop_on_signals(shutdown)
    print(f"compute node {handler.node_id} pulling from {host}:{port} "
          f"(load {args.load_prob}, delay {args.load_delay}s, {threads})", flush=True)
    try:
        worker.run()
    except PullStopped as exc:
        if not worker.stopped.is_set():
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(f"compute node {handler.node_id} stopped", flush=True)
    return 0
