"""Command line of the coordinator: `python coordinator_node.py <port> <policy> [options]`."""

from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from thrift_trainer.coordinator import tracking
from thrift_trainer.coordinator.checkpoint import CheckpointError
from thrift_trainer.coordinator.handler import CoordinatorHandler
from thrift_trainer.coordinator.leadership import LEASE_SECONDS
from thrift_trainer.coordinator.postgres_location import is_postgres_url
from thrift_trainer.coordinator.records import InvalidRun
from thrift_trainer.coordinator.request_checks import RequestLimits
from thrift_trainer.coordinator.run import CoordinatorSettings
from thrift_trainer.coordinator.run_setup import weights_folders
from thrift_trainer.coordinator.run_store import RunStoreError
from thrift_trainer.coordinator.store_lock import StoreInUse
from thrift_trainer.coordinator.store_outage import OUTAGE_SECONDS
from thrift_trainer.dashboard.options import add_arguments as add_dashboard_arguments
from thrift_trainer.engine.nodes.liveness import DEAD_SECONDS, HEARTBEAT_SECONDS, SUSPECT_SECONDS
from thrift_trainer.engine.nodes.nodes_file import (
    NodeAddress,
    NodesFile,
    NodesFileError,
    NoNodesListed,
)
from thrift_trainer.engine.policies import POLICY_NAMES
from thrift_trainer.engine.round_engine import EngineSettings
from thrift_trainer.training import plugins
from thrift_trainer.training.data import paths
from thrift_trainer.training.data.paths import CHECKOUT, DEFAULT_DATA_ROOT
from thrift_trainer.wire import arg_types, security
from thrift_trainer.wire.generated import Coordinator
from thrift_trainer.wire.launch import stop_on_signals, warn_if_exposed, write_port_file
from thrift_trainer.wire.log_limit import add_log_level_argument, setup_logging
from thrift_trainer.wire.rpc import ThriftServer

if TYPE_CHECKING:
    from thrift_trainer.dashboard.server import Dashboard

# The checkout's nodes file; for an installed trainer, the one in the current folder.
NODES_FILE = (CHECKOUT or Path.cwd()) / "compute_nodes.txt"
MAX_THREADS = 1024  # worker threads of one round; more only exhausts the process
LIMIT = arg_types.int_range(1, 2**31 - 1)  # request fields travel as Thrift i32s


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Per-request limits: a request over one is refused with a message naming the field."""
    d = RequestLimits()
    group = parser.add_argument_group(
        "request limits", "the most one train request may ask for; a request over a limit is "
                          "refused with a message naming the field")
    group.add_argument("--max-rounds", type=LIMIT, default=d.max_rounds, metavar="N",
                       help=f"rounds of a run (default {d.max_rounds})")
    group.add_argument("--max-epochs", type=LIMIT, default=d.max_epochs, metavar="N",
                       help="local epochs (or discriminator steps) a node makes per unit "
                            f"(default {d.max_epochs})")
    group.add_argument("--max-hidden", type=LIMIT, default=d.max_hidden, metavar="N",
                       help=f"units of one hidden layer (default {d.max_hidden})")
    group.add_argument("--max-units", type=LIMIT, default=d.max_units, metavar="N",
                       help=f"work units sent out per round (default {d.max_units})")
    group.add_argument("--max-model-mb", type=arg_types.positive_float, default=d.max_model_mb,
                       metavar="MIB", help="size of the model's weights in MiB (the MLP's "
                                           "counted as float64; default "
                                           f"{d.max_model_mb:g}); weights and updates of any "
                                           "size travel in chunks (--chunk-mb)")


def limits_from(args: argparse.Namespace) -> RequestLimits:
    return RequestLimits(max_rounds=args.max_rounds, max_epochs=args.max_epochs,
                         max_hidden=args.max_hidden, max_units=args.max_units,
                         max_model_mb=args.max_model_mb)


def build_parser() -> argparse.ArgumentParser:
    policies = ", ".join(f"{n} {name}" for n, name in POLICY_NAMES.items())
    parser = argparse.ArgumentParser(
        prog=arg_types.command_name("coordinator_node.py"),
        description="Run the coordinator: it splits training into work units and sends them, "
                    "with the current weights, to the compute nodes of the nodes file.",
        epilog="Example: python coordinator_node.py 9095 2",
    )
    parser.add_argument("port", type=arg_types.listen_port,
                        help="TCP port to listen on (0 = any free port)")
    parser.add_argument("policy", type=arg_types.int_range(1, max(POLICY_NAMES)),
                        choices=sorted(POLICY_NAMES), metavar="policy",
                        help=f"scheduling policy: {policies}")
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to bind (default 0.0.0.0: every interface)")
    parser.add_argument("--nodes-file", default=str(NODES_FILE),
                        help="'host,port' per line, re-read before every round, so nodes "
                             "added join a running job (default: %(default)s)")
    parser.add_argument("--data-root", default=str(DEFAULT_DATA_ROOT),
                        help="folder holding the data sets (default: %(default)s)")
    paths.add_argument(parser)
    parser.add_argument("--run-dir", default="runs",
                        help="folder for each run's metrics, checkpoint and model "
                             "(default: ./runs)")
    parser.add_argument("--weights-dir", action="append", default=[], metavar="DIR",
                        help="folder a run's starting weights (run.init_weights) may come "
                             "from, besides the data root and the run folders; repeat it "
                             "or give a comma-separated list. Any other path is refused")
    parser.add_argument("--track", action="append", default=[], type=_track_target,
                        metavar="KIND:WHERE",
                        help="also write every run's figures, settings and model to "
                             "tensorboard:DIR (event files in DIR/<run id>) or mlflow:URI (an "
                             "MLflow run per run, e.g. mlflow:sqlite:///mlflow.db); repeatable; "
                             "needs pip install 'thrift-trainer[tracking]'")
    parser.add_argument("--store", default=None, metavar="PATH_OR_URL",
                        help="run store: runs, rounds, every unit's status changes, node "
                             "statistics. A file path is an SQLite store for this coordinator "
                             "alone (default: <run-dir>/runs.db); postgresql://USER@HOST:PORT/DB "
                             "is a PostgreSQL store that several coordinators share: one leads, "
                             "the others stand by and take over its runs if it dies")
    parser.add_argument("--lease", type=arg_types.seconds, default=LEASE_SECONDS,
                        metavar="SECONDS",
                        help="with a PostgreSQL store: the leader's lease, renewed every third "
                             "of it; a standby takes over this long after the leader stops "
                             f"renewing (default {LEASE_SECONDS:g})")
    parser.add_argument("--store-outage", type=arg_types.seconds, default=OUTAGE_SECONDS,
                        metavar="SECONDS",
                        help="with a PostgreSQL store: while its database cannot be reached, "
                             "training pauses (status says so) and carries on when it is back; "
                             "a run fails after this long, and is resumed once it is back "
                             f"(default {OUTAGE_SECONDS:g})")
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help="with a PostgreSQL store: the host name clients and the other "
                             "coordinators are told to reach this one at (default: --host, "
                             "or this machine's name when --host is 0.0.0.0)")
    parser.add_argument("--threads", type=arg_types.int_range(1, MAX_THREADS), default=None,
                        help="worker threads per round (default: number of nodes + 2)")
    parser.add_argument("--no-speculation", action="store_true",
                        help="never start a backup attempt of a slow unit on an idle node")
    parser.add_argument("--speculate-after", type=arg_types.seconds,
                        default=None, metavar="SECONDS",
                        help="a unit out this long (or 4x the usual unit time, if longer) gets "
                             "a backup attempt on an idle node; the first result wins "
                             "(default: 0.25 for policies 1 and 2; policy 3 uses 3x the "
                             "measured unit time)")
    parser.add_argument("--max-unit-failures", type=arg_types.positive_int, default=3,
                        help="failures after which a unit is discarded for its round (default 3)")
    parser.add_argument("--grace", type=arg_types.seconds, default=30.0, metavar="SECONDS",
                        help="a run fails when no node has answered for this long, or fewer than "
                             "--min-nodes have (default 30)")
    parser.add_argument("--min-nodes", type=arg_types.positive_int, default=1, metavar="N",
                        help="a run needs N answering nodes: with fewer it fails after --grace "
                             "seconds, or pauses with --pause-below-min (default 1)")
    parser.add_argument("--pause-below-min", action="store_true",
                        help="with fewer than --min-nodes answering, pause the run (status: "
                             "waiting for nodes) until enough answer again")
    parser.add_argument("--max-pause", type=arg_types.seconds, default=600.0, metavar="SECONDS",
                        help="longest pause below --min-nodes, and longest wait for "
                             "--wait-for-nodes, before the run fails (default 600)")
    parser.add_argument("--wait-for-nodes", type=arg_types.non_negative_int, default=0, metavar="N",
                        help="start a run's first round only once N nodes have answered "
                             "(default 0: at once)")
    parser.add_argument("--rpc-timeout", type=arg_types.seconds, default=300.0, metavar="SECONDS",
                        help="longest wait for one training call (default 300)")
    parser.add_argument("--connect-timeout", type=arg_types.seconds, default=3.0, metavar="SECONDS",
                        help="longest wait to connect to a node (default 3)")
    parser.add_argument("--heartbeat", type=arg_types.seconds,
                        default=HEARTBEAT_SECONDS, metavar="SECONDS",
                        help="how often nodes are pinged (pull nodes call in as often) "
                             f"(default {HEARTBEAT_SECONDS:g})")
    parser.add_argument("--suspect-after", type=arg_types.seconds, default=SUSPECT_SECONDS,
                        metavar="SECONDS", help="a node silent this long is suspect "
                                                f"(default {SUSPECT_SECONDS:g})")
    parser.add_argument("--dead-after", type=arg_types.seconds,
                        default=DEAD_SECONDS, metavar="SECONDS",
                        help="a node silent this long is dead and its units go to other nodes "
                             f"(default {DEAD_SECONDS:g})")
    parser.add_argument("--deadline-floor", type=arg_types.seconds,
                        default=EngineSettings.deadline_floor,
                        metavar="SECONDS",
                        help="a unit may go --deadline-factor times its node's unit time "
                             "without progress, at most --rpc-timeout and at least this "
                             "while the node has no measured unit time (then at least 5 s, "
                             "or this if lower); a unit past it is reclaimed and issued "
                             "again (batches done and time in a load delay count as "
                             f"progress) (default {EngineSettings.deadline_floor:g})")
    parser.add_argument("--deadline-factor", type=arg_types.positive_float,
                        default=EngineSettings.deadline_factor,
                        metavar="X",
                        help="a unit may go X times its node's usual unit time without "
                             "progress before it is reclaimed and issued again (within "
                             "--deadline-floor and --rpc-timeout) "
                             f"(default {EngineSettings.deadline_factor:g})")
    parser.add_argument("--max-update-norm", type=arg_types.non_negative_float,
                        default=EngineSettings.max_update_norm,
                        metavar="X",
                        help="refuse an update whose norm is over X times the median of recent "
                             "ones; its unit goes to another node (0: no limit) "
                             f"(default {EngineSettings.max_update_norm:g})")
    parser.add_argument("--deterministic", action="store_true",
                        help="rounds that need K of N units run their first K units, not "
                             "the first K to finish, so repeated runs give the same bits "
                             "(results are combined in unit order in every mode)")
    parser.add_argument("--seed", type=arg_types.seed,
                        default=None, help="seed of the scheduling policy")
    parser.add_argument("--resume", default=None, metavar="RUN_ID",
                        help="continue this run of --run-dir from its last checkpoint (after "
                             "a crash or kill); follow it with 'client.py attach HOST PORT RUN_ID'")
    parser.add_argument("--rounds", type=arg_types.positive_int, default=None, metavar="N",
                        help="with --resume: extend the run to N rounds in all (more than it "
                             "was asked for), also when it has completed")
    parser.add_argument("--port-file", default=None,
                        help="write the bound port to this file once listening (for scripts)")
    add_log_level_argument(parser)
    plugins.add_arguments(parser)
    add_limit_arguments(parser)
    security.add_arguments(parser, serves=True)
    add_dashboard_arguments(parser)
    return parser



def settings_from(args: argparse.Namespace) -> CoordinatorSettings:
    uses_postgres = args.store is not None and is_postgres_url(args.store)
    engine = EngineSettings(threads=args.threads, speculation=not args.no_speculation,
                            speculate_after=args.speculate_after,
                            max_unit_failures=args.max_unit_failures, grace_seconds=args.grace,
                            deterministic=args.deterministic,
                            deadline_floor=args.deadline_floor,
                            deadline_factor=args.deadline_factor,
                            deadline_cap=args.rpc_timeout,
                            max_update_norm=args.max_update_norm or None,
                            min_nodes=args.min_nodes, pause_below_min=args.pause_below_min,
                            max_pause=args.max_pause)
    return CoordinatorSettings(data_root=Path(args.data_root), run_root=Path(args.run_dir),
                               policy=args.policy, rpc_timeout=args.rpc_timeout,
                               connect_timeout=args.connect_timeout, seed=args.seed,
                               engine=engine, heartbeat_seconds=args.heartbeat,
                               suspect_seconds=args.suspect_after,
                               dead_seconds=args.dead_after,
                               wait_for_nodes=args.wait_for_nodes,
                               store_path=(Path(args.store) if args.store and not uses_postgres
                                           else None),
                               store_url=args.store if uses_postgres else None,
                               lease_seconds=args.lease, store_outage=args.store_outage,
                               limits=limits_from(args),
                               weights_dirs=weights_folders(args.weights_dir),
                               track=tuple(args.track))


def _track_target(text: str) -> str:
    """--track's argparse type: a known kind whose package is installed."""
    try:
        return tracking.check_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds is not None and not args.resume:
        parser.error("--rounds extends a run: it needs --resume RUN_ID")
    setup_logging(args.log_level, "%(asctime)s coordinator %(levelname)s %(message)s")
    # A fatal signal (SIGBUS when the store's WAL index file is truncated under SQLite's
    # memory map, SIGSEGV) still leaves the signal and the Python stacks in the log.
    faulthandler.enable(all_threads=True)
    security_problem = security.configure_from_args(args, serves=True)
    if security_problem:
        print(f"error: {security_problem}", file=sys.stderr)
        return 2
    plugin_problem = plugins.allow_from_args(args, "coordinator")
    if plugin_problem:
        print(f"error: {plugin_problem}", file=sys.stderr)
        return 2
    if _read_nodes(NodesFile(args.nodes_file)) is None:  # before the run store is opened
        return 1
    if not os.path.isdir(args.data_root):
        print(f"error: data root {args.data_root} does not exist", file=sys.stderr)
        return 1
    missing = [str(d) for d in weights_folders(args.weights_dir) if not d.is_dir()]
    if missing:
        print(f"error: --weights-dir {missing[0]} is not a folder", file=sys.stderr)
        return 2
    paths.follow_links(args.follow_data_links)
    tracking.load_libraries(args.track)  # before serving: a run's start never waits on it
    try:
        handler = CoordinatorHandler(Path(args.nodes_file), settings_from(args))
    except StoreInUse as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (RunStoreError, OSError) as exc:
        print(f"error: cannot open the run store: {exc}", file=sys.stderr)
        return 1
    try:
        dashboard = _dashboard(args, handler)
    except ModuleNotFoundError as exc:
        print(f"error: --dashboard-port needs the web stack ({exc.name} is missing): "
              "pip install 'thrift-trainer[dashboard]', or the requirements.txt of the "
              "repository", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot serve the dashboard on {args.dashboard_host}:"
              f"{args.dashboard_port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    served = dashboard.timed(handler) if dashboard else handler
    try:
        server = ThriftServer(Coordinator.Processor(served), args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    handler.nodes_file.serve_at(args.host, server.port)
    if handler.settings.store_url is not None:
        handler.lead_when_elected(f"{advertised_host(args)}:{server.port}")
    # again: a line naming our own port is refused; no listed node is said once, here
    nodes = _read_nodes(handler.nodes_file, tell_if_none=True)
    if nodes is None:
        server.stop()
        return 1
    if args.resume and not handler.leading:
        print(f"error: cannot resume run {args.resume}: this coordinator stands by "
              f"({handler.leader_line()}); the leader takes up interrupted runs by itself",
              file=sys.stderr)
        server.stop()
        return 1
    if args.resume:
        try:
            handler.resume(args.resume, args.rounds)
        except (CheckpointError, NodesFileError) as exc:
            print(f"error: cannot resume run {args.resume}: {exc}", file=sys.stderr)
            return 1
        except InvalidRun as exc:
            print(f"error: cannot resume run {args.resume}: {exc}", file=sys.stderr)
            return 1
    stop_on_signals(lambda: handler.shutdown(then=server.stop))
    if args.port_file:
        write_port_file(args.port_file, server.port)
    warn_if_exposed([(args.host, server.port)] + (
        [(args.dashboard_host, dashboard.port)] if dashboard is not None else []))
    print(f"coordinator listening on {args.host}:{server.port}, policy {args.policy} "
          f"({POLICY_NAMES[args.policy]}), {len(nodes)} nodes in {args.nodes_file}", flush=True)
    if handler.keeper is not None:
        print(f"{'leading' if handler.leading else 'standing by'}: {handler.leader_line()}",
              flush=True)
    if dashboard is not None:
        dashboard.start()
        print(f"dashboard at {dashboard.url}", flush=True)
    server.serve_forever()
    if dashboard is not None:
        dashboard.stop()
    print("coordinator stopped", flush=True)
    return 0


def advertised_host(args: argparse.Namespace) -> str:
    if args.advertise:
        return args.advertise
    return socket.gethostname() if args.host in ("0.0.0.0", "::", "") else args.host


def _dashboard(args: argparse.Namespace, handler: CoordinatorHandler) -> Dashboard | None:
    """The dashboard of --dashboard-port, bound but not yet serving; None without one."""
    if args.dashboard_port is None:
        return None
    from thrift_trainer.dashboard import (
        server as dashboard_server,  # the web stack, only when asked for
    )

    settings = dashboard_server.DashboardSettings(
        host=args.dashboard_host, port=args.dashboard_port, token=security.current().token,
        tls_cert=args.tls_cert, tls_key=args.tls_key)
    return dashboard_server.Dashboard(handler, settings)


def _read_nodes(nodes_file: NodesFile, tell_if_none: bool = False) -> list[NodeAddress] | None:
    """The file's nodes (none when it is missing or empty: nodes may register), or None
    after printing why it cannot be used."""
    try:
        return nodes_file.read()
    except NoNodesListed as exc:
        if tell_if_none:
            print(f"{exc}; until then only nodes that register (--register, --pull) train",
                  flush=True)
        return []
    except NodesFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
