"""Command line of the client.

The positional form trains (the default command):
    python client.py <coordinator_ip> <port> <data_dir> <rounds> <epochs> <h> <eta> [options]
and so does the configuration form, where a YAML recipe (config.yaml's layout, configs/)
replaces data_dir..eta and the model options:
    python client.py <coordinator_ip> <port> --config PATH [--set SECTION.KEY=VALUE ...]
Other actions are subcommands: status, runs, attach, cancel, evaluate, predict, export,
compare (finished runs side by side) and sweep (a grid of settings over seeds).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

from thrift_trainer.client import display, sweep
from thrift_trainer.client.compare import CompareError, compare, save_record, table_lines
from thrift_trainer.client.errors import (
    EXIT_CANCELLED,
    EXIT_FAILURE,
    EXIT_USAGE,
    ClientError,
    Terminated,
    interrupted_exit,
)
from thrift_trainer.client.model_commands import (
    DEFAULT_VALIDATION,
    ModelCommandError,
    evaluate,
    evaluate_gan,
    export,
    export_weights,
    is_generator,
    predict,
)
from thrift_trainer.client.session import Coordinators, Endpoint, attach, call, follow_training
from thrift_trainer.training import plugins
from thrift_trainer.training.models.names import GAN_MODELS
from thrift_trainer.training.outputs.model_file import save_model
from thrift_trainer.training.run_config import RunConfig, RunConfigError, load_run_config
from thrift_trainer.training.schema import DeltaAvgSettings, defaults, rounds_problem
from thrift_trainer.training.spec import RunSpec
from thrift_trainer.wire import arg_types, security
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes
from thrift_trainer.wire.log_limit import setup_logging
from thrift_trainer.wire.tensor_codec import wire_to_dict

SUBCOMMANDS = ("status", "runs", "attach", "cancel", "evaluate", "predict", "export",
               "compare", "sweep")
EXIT_CODES_HELP = (
    "Exit codes: 0 success, 1 a failure (one line on stderr), 2 bad arguments or a bad\n"
    "  configuration (one the coordinator refused before the run included),\n"
    "  3 the run was cancelled on the coordinator (client.py cancel, another client,\n"
    "  the coordinator shutting down), 130 this client cancelled it on Ctrl-C,\n"
    "  143 likewise on SIGTERM (kill); attach only stops following the run.")
DEFAULT_SCORED = 2000  # images a generator is scored on by `evaluate`
# The positional form's flags are delta_avg's keys, with the schema's defaults.
DELTA_AVG = defaults(DeltaAvgSettings)
CONFIG_FLAG = "--config"
SET_FLAG = "--set"
TRAIN_USAGE = (
    "client.py coordinator_ip port data_dir rounds epochs h eta [options]\n"
    "       client.py coordinator_ip port [--config PATH] [--set SECTION.KEY=VALUE ...] "
    "[options]"
)
# Appended to argparse's errors so that each form's error points at the other form.
POSITIONAL_FORM_HINTS = {
    "the following arguments are required": " (or give the run as --config PATH and/or "
                                            "--set SECTION.KEY=VALUE)",
}
CONFIG_FORM_HINTS = {
    "unrecognized arguments": " (with --config the run comes from the file: change it with "
                              "--set SECTION.KEY=VALUE, e.g. --set run.rounds=3, not with "
                              "data_dir..eta or the model options)",
}



def ROUNDS(text: str) -> int:  # noqa: N802 - an argparse type, named like the others
    """Rounds travel as a 32-bit integer: a larger number could not even be sent."""
    rounds = arg_types.whole_number(text)
    problem = rounds_problem(rounds)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return rounds


def _hidden_list(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of sizes") \
            from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"hidden sizes must be positive, got {text!r}")
    return sizes


class TrainParser(argparse.ArgumentParser):
    """A parser whose usage errors also say how the other form of the train command reads.

    The two forms share options but not positionals, so argparse's own message ("arguments
    are required", "unrecognized arguments") tells only half the story.
    """

    def __init__(self, *args: Any, hints: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hints = hints

    def error(self, message: str) -> NoReturn:
        hint = next((h for prefix, h in self.hints.items() if message.startswith(prefix)), "")
        super().error(f"{message}{hint}")


def uses_config(argv: list[str]) -> bool:
    """Whether argv asks for the configuration form: --config (or a prefix argparse accepts),
    or --set alone, which changes the defaults of config.yaml."""
    for token in argv:
        if token == "--":
            return False
        flag = token.split("=", 1)[0]
        if len(flag) > len("--con") and CONFIG_FLAG.startswith(flag) or flag == SET_FLAG:
            return True
    return False


def build_train_parser(with_config: bool = False) -> TrainParser:
    """The train command; with --config, what follows the port comes from the file instead."""
    parser = TrainParser(
        prog=arg_types.command_name("client.py"),
        usage=TRAIN_USAGE.replace("client.py", arg_types.command_name("client.py")),
        hints=CONFIG_FORM_HINTS if with_config else POSITIONAL_FORM_HINTS,
        description="Train a model on the coordinator's compute nodes and print the final "
                    "validation error\n(a GAN: its latest IS and FID).\nOther actions: client.py "
                    f"{{{','.join(SUBCOMMANDS)}}} --help.",
        epilog="Examples:\n"
               "  python client.py localhost 9095 letters 5 15 20 0.0001\n"
               "  python client.py localhost 9095 --config configs/letters_recommended.yaml "
               "--set delta_avg.eta=0.01\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_endpoint(parser)
    if not with_config:
        add_run_positionals(parser)
        add_model_options(parser)
    add_config_options(parser)
    add_run_options(parser)
    return parser


def add_run_positionals(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", help="data set folder under the coordinator's and nodes' "
                                         "data root, e.g. letters")
    parser.add_argument("rounds", type=ROUNDS,
                        help="rounds (global model updates)")
    parser.add_argument("epochs", type=arg_types.positive_int, help="local epochs per work unit")
    parser.add_argument("h", type=arg_types.positive_int, help="hidden units of the MLP")
    parser.add_argument("eta", type=arg_types.positive_float, help="learning rate")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model and optimisation (positional form)")
    model.add_argument("--hidden", type=_hidden_list, default=None, metavar="H1,H2,...",
                       help="hidden layer sizes, overriding h (e.g. 256,256)")
    model.add_argument("--compat", action="store_true",
                       help="reproduce the assignment's reference MLP exactly (linear forward "
                            "pass, masked backward pass, early stop)")
    model.add_argument("--scale-features", action="store_true",
                       help="divide the 0..15 features by 15")
    model.add_argument("--local-optimizer", choices=["gd", "sgd", "adam"],
                       default=DELTA_AVG["local_optimizer"],
                       help="optimizer on the nodes: gd full-batch (default), sgd or adam "
                            "minibatch")
    model.add_argument("--batch-size", type=arg_types.positive_int,
                       default=DELTA_AVG["batch_size"],
                       help="minibatch size of sgd/adam (default %(default)s)")
    model.add_argument("--server-optimizer", choices=["avg", "momentum", "adam"],
                       default=DELTA_AVG["server_optimizer"],
                       help="how the coordinator applies the averaged delta: avg adds it "
                            "(default), momentum or adam treat it as a gradient")
    model.add_argument("--server-lr", type=arg_types.positive_float,
                       default=DELTA_AVG["server_lr"],
                       help="learning rate of the server optimizer (default %(default)s)")
    model.add_argument("--server-momentum", type=arg_types.probability,
                       default=DELTA_AVG["server_momentum"],
                       help="momentum of the momentum server optimizer (default %(default)s)")
    model.add_argument("--seed", type=arg_types.seed, default=DELTA_AVG["seed"],
                       help="initialisation seed (default %(default)s)")
    model.add_argument("--algorithm", choices=["delta_avg"], default="delta_avg",
                       help="training algorithm of the positional form (default delta_avg); "
                            "sync_sgd, md_gan and fl_gan run from --config")
    model.add_argument("--model", choices=["mlp"], default="mlp",
                       help="model of the positional form (default mlp); the GANs "
                            f"({', '.join(GAN_MODELS)}) run from --config")


def add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration form")
    group.add_argument(CONFIG_FLAG, metavar="PATH", default=None,
                       help="take the run from a YAML recipe, e.g. configs/letters_recommended"
                            ".yaml (config.yaml lists every key with its default); it replaces "
                            "data_dir, rounds, epochs, h, eta and the model options")
    group.add_argument(SET_FLAG, action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="change one key of the run (of the --config recipe, or of "
                            "config.yaml's defaults without one), repeatable, e.g. --set "
                            "delta_avg.eta=0.01 --set run.rounds=3, or a key inside a "
                            "mapping, e.g. --set run.algorithm_args.mu=0.01; VALUE is YAML: 3, "
                            "0.1, true, [128,128]")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument("--run-id", default=None, help="name of the run (default: random)")
    run.add_argument("--out", default="models",
                     help="folder for the trained model file (default: ./models)")
    add_follow_options(run)


def add_follow_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How a training command follows its runs: progress, giving up, output."""
    parser.add_argument("--poll", type=arg_types.seconds, default=0.5, metavar="SECONDS",
                        help="progress refresh interval (default 0.5)")
    parser.add_argument("--dead-after", type=arg_types.seconds, default=15.0,
                        metavar="SECONDS", help="give up when the coordinator has not "
                                                "answered for this long (default 15)")
    add_output_flags(parser)


def add_endpoint(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("coordinator_ip",
                        help="host name or address of the coordinator; a leader and its "
                             "standbys as a comma-separated list (h1,h2): the client follows "
                             "whichever leads")
    parser.add_argument("port", type=arg_types.ports,
                        help="port of the coordinator; with several hosts, one port for all "
                             "or a comma-separated list, one per host")
    parser.add_argument("--connect-timeout", type=arg_types.seconds, default=5.0,
                        metavar="SECONDS",
                        help="longest wait for a connection to the coordinator before giving "
                             "up (default 5)")
    security.add_arguments(parser, serves=False)


def coordinators_of(args: argparse.Namespace) -> Coordinators:
    """The coordinators to call, with the token and TLS of the flags in force for every
    call. Hosts and ports pair up as libpq's do: one port serves every host."""
    problem = security.configure_from_args(args, serves=False)
    if problem:
        raise ClientError(problem, exit_code=2)
    hosts = [h.strip() for h in args.coordinator_ip.split(",")]
    if not all(hosts):
        raise ClientError(f"coordinator_ip: an empty host in {args.coordinator_ip!r}",
                          exit_code=2)
    ports = args.port * len(hosts) if len(args.port) == 1 else args.port
    if len(ports) != len(hosts):
        raise ClientError(f"{len(hosts)} hosts but {len(ports)} ports: give one port for "
                          "all, or one per host", exit_code=2)
    return Coordinators([Endpoint(h, p, args.connect_timeout) for h, p in zip(hosts, ports,
                                                                              strict=True)])


def add_output_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress display; print only the result")
    add_json_flag(parser, "print the result as JSON on stdout (implies no progress display)")


def add_json_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  text: str = "print JSON on stdout") -> None:
    parser.add_argument("--json", action="store_true", help=text)


def build_subcommand_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=arg_types.command_name("client.py"),
                                     description="Client actions.")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="progress of a run (default: the latest)")
    add_endpoint(status)
    status.add_argument("run_id", nargs="?", default="", help="run id (default: latest)")
    add_json_flag(status)
    runs = sub.add_parser("runs", help="list the coordinator's runs, one line each")
    add_endpoint(runs)
    runs.add_argument("--nodes", action="store_true",
                      help="show each run as status does, with its table of nodes")
    add_json_flag(runs)
    attach = sub.add_parser("attach", help="follow a running run until it ends (e.g. one "
                                           "resumed after a coordinator restart)")
    add_endpoint(attach)
    attach.add_argument("run_id", nargs="?", default="", help="run id (default: latest)")
    attach.add_argument("--poll", type=arg_types.seconds, default=1.0, metavar="SECONDS",
                        help="seconds between status updates (default 1)")
    attach.add_argument("--dead-after", type=arg_types.seconds, default=60.0, metavar="SECONDS",
                        help="give up after the coordinator is silent this long (default 60)")
    add_output_flags(attach)
    cancel = sub.add_parser("cancel", help="cancel a running run")
    add_endpoint(cancel)
    cancel.add_argument("run_id", help="run id")
    ev = sub.add_parser("evaluate", help="score a saved model: the run's metric and loss on "
                                         "labelled data, a generator's IS and FID")
    ev.add_argument("model", help="model or checkpoint file (.npz), or a .safetensors file "
                                  "the trainer wrote")
    ev.add_argument("--data", default=None,
                    help="labelled data in the format the model was trained on: a letters "
                         "file, a CSV/TSV table (file or folder), a folder of class folders, "
                         f"an MNIST folder, an .npz (default for letters: {DEFAULT_VALIDATION})")
    ev.add_argument("--n", type=arg_types.positive_int, default=None,
                    help=f"generator only: images scored against held-out MNIST (default "
                         f"{DEFAULT_SCORED})")
    ev.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_arguments(ev)
    pr = sub.add_parser("predict", help="predict each row of a table (the letters MLP: a "
                                        "letter per row of a CSV) or each image")
    pr.add_argument("model", help="model file (.npz or .safetensors)")
    pr.add_argument("data", help="data in the format the model was trained on: a table "
                                 "(its label column, if present, is ignored), an image or a "
                                 "folder of images, an .npz/.npy of inputs")
    plugins.add_arguments(pr)
    ex = sub.add_parser("export", help="write a saved model (or a checkpoint's model) as "
                                       "safetensors, which plain torch loads")
    ex.add_argument("model", help="model or checkpoint file (.npz)")
    ex.add_argument("--out", default=None, metavar="PATH",
                    help="the safetensors file (default: the model's path with the suffix "
                         ".safetensors)")
    add_compare_parser(sub)
    add_sweep_parser(sub)
    return parser


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser(
        "compare", help="finished runs side by side: a table and one picture of their curves",
        description="Compare finished runs: a table of final and best figures (runs that\n"
                    "differ only in their seed: mean ± spread) and one picture of their\n"
                    "curves overlaid.",
        epilog="A RUN is a coordinator's run folder (runs/ID), a client's record of a run\n"
               "(models/ID.json, written beside each model), or a run id looked up in\n"
               "./models and ./runs.\n  python client.py compare runs/fedavg runs/fedprox "
               "--out fedprox.png", formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("runs", nargs="+", metavar="RUN", help="run folder, record or run id")
    cmp.add_argument("--out", default="compare.png", metavar="PATH",
                     help="the picture (default: compare.png)")
    cmp.add_argument("--title", default="", help="the picture's title")
    cmp.add_argument("--json", action="store_true", help="print the table as JSON")


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser(
        "sweep", help="train a grid of settings over seeds, one run after another, and "
                      "compare them",
        description=sweep.__doc__.split("\n\n")[0],
        epilog="Example:\n  python client.py sweep localhost 9095 --config "
               "configs/letters_recommended.yaml \\\n      --grid delta_avg.eta=0.01,0.1 "
               "--seeds 1,2,3\nValues are YAML, split on commas outside brackets: --grid "
               "delta_avg.hidden=[64,64],[128]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_endpoint(sw)
    add_config_options(sw)
    sw.add_argument("--grid", action="append", default=[], metavar="SECTION.KEY=V1,V2",
                    help="a key and the values it takes, repeatable (every combination runs)")
    sw.add_argument("--seeds", type=sweep.parse_seeds, default=None, metavar="S1,S2",
                    help="run.seed values each combination runs with (default: the "
                         "configuration's seed)")
    sw.add_argument("--name", default=None,
                    help="the sweep's name, the prefix of its run ids (default: "
                         "sweep-<date>-<time>)")
    sw.add_argument("--out", default=None, metavar="DIR",
                    help="folder for the models, records and comparison (default: "
                         "sweeps/<name>)")
    add_follow_options(sw)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging("WARNING", "%(message)s")  # what Python prints anyway, rate-limited
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _run(argv)
    except (ClientError, ModelCommandError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except RunConfigError as exc:  # a bad configuration is bad arguments: exit 2
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # while nothing was left to cancel
        return interrupted_exit(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return run_subcommand(build_subcommand_parser().parse_args(argv))
    return run_train(parse_train_args(argv))


def _terminated(signum: int, frame: object) -> None:  # noqa: ARG001 - signal signature
    """SIGTERM stops the client as Ctrl-C does: a run it follows is cancelled."""
    raise Terminated


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    """Parse either form; --config decides which, before argparse sees the positionals."""
    with_config = uses_config(argv)
    parser = build_train_parser(with_config)
    args = parser.parse_args(argv)
    return args


def train_config(args: argparse.Namespace) -> dict:
    return {
        "epochs": args.epochs, "eta": args.eta, "hidden": args.hidden or [args.h],
        "compat": args.compat, "scale_features": args.scale_features,
        "local_optimizer": args.local_optimizer, "batch_size": args.batch_size,
        "server_optimizer": args.server_optimizer, "server_lr": args.server_lr,
        "server_momentum": args.server_momentum, "seed": args.seed,
    }


def train_request(args: argparse.Namespace, run_id: str) -> ttypes.TrainRequest:
    """The request of either form; a --config run is loaded (and checked) here, offline."""
    if args.config is None and not args.set:
        spec = RunSpec(args.algorithm, args.model, args.data_dir, train_config(args))
        return ttypes.TrainRequest(
            protocol_version=PROTOCOL_VERSION, run_id=run_id, algorithm=spec.algorithm,
            model=spec.model, dataset=spec.dataset, rounds=args.rounds,
            config_json=spec.to_config_json(with_schedule=True))
    return config_request(load_run_config(args.config, args.set), run_id)


def config_request(config: RunConfig, run_id: str) -> ttypes.TrainRequest:
    """The request of a merged configuration (the --config form, the notebook API)."""
    spec = config.to_spec()
    return ttypes.TrainRequest(
        protocol_version=PROTOCOL_VERSION, run_id=run_id, algorithm=spec.algorithm,
        model=spec.model, dataset=spec.dataset, rounds=config.rounds,
        config_json=spec.to_config_json(with_schedule=True),
        outputs_json=json.dumps(dict(config.outputs)))


def run_train(args: argparse.Namespace) -> int:
    run_id = args.run_id or uuid.uuid4().hex[:12]
    request = train_request(args, run_id)
    result = train_and_keep(coordinators_of(args), request, Path(args.out), args)
    display.print_result(result, args.json)
    return 0


def train_and_keep(coordinators: Coordinators, request: ttypes.TrainRequest, folder: Path,
                   args: argparse.Namespace) -> dict[str, Any]:
    """Train `request` with progress, save its model (and, beside it, the same model as
    `export` writes it: safetensors) and the record `compare` reads in `folder`, and return
    the result as --json prints it."""
    with display.ProgressView(quiet=args.quiet or args.json) as view:
        result = follow_training(coordinators, request, view, args.poll, args.dead_after)
        view.finish(result)
    return keep_result(result, request, folder)


def keep_result(result: ttypes.RunResult, request: ttypes.TrainRequest,
                folder: Path) -> dict[str, Any]:
    """Save a finished run's model, its safetensors export and its record in `folder`;
    the result as --json prints it."""
    weights, description = wire_to_dict(result.weights), json.loads(result.model_json)
    model_path = save_model(folder / f"{request.run_id}.npz", weights, description)
    exported = export_weights(weights, description, model_path.with_suffix(".safetensors"))
    shown = display.result_dict(result, str(model_path), str(exported))
    save_record(folder / f"{request.run_id}.json", request, shown)
    return shown


def run_compare(args: argparse.Namespace) -> int:
    try:
        compared = compare(args.runs, args.out, search=[Path("models"), Path("runs")],
                           title=args.title)
    except CompareError as exc:
        raise ClientError(str(exc), exit_code=EXIT_USAGE) from None
    if args.json:
        print(json.dumps(compared, indent=1))
    else:
        print("\n".join(table_lines(compared["settings"])))
        print(f"picture: {compared['picture']}")
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    if not args.grid and not args.seeds:
        raise ClientError("a sweep needs --grid SECTION.KEY=V1,V2 and/or --seeds S1,S2",
                          exit_code=EXIT_USAGE)
    name = args.name or time.strftime("sweep-%Y%m%d-%H%M%S")
    folder = Path(args.out or Path("sweeps") / name)
    try:
        grid = sweep.parse_grid(args.grid)
    except ValueError as exc:
        raise ClientError(str(exc), exit_code=EXIT_USAGE) from None

    def build(sets: list[str], run_id: str) -> ttypes.TrainRequest:
        return train_request(argparse.Namespace(config=args.config, set=sets), run_id)

    try:
        planned = sweep.plan(name, grid, args.seeds, args.set, build)
    except (ValueError, RunConfigError) as exc:
        raise ClientError(f"the sweep was not started: {exc}", exit_code=EXIT_USAGE) from None
    coordinators = coordinators_of(args)
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    records, failures = sweep.run_all(
        planned, folder, lambda run: train_and_keep(coordinators, run.request, folder, args),
        say)
    return sweep.finish(records, failures, folder, name, args.json)


def run_subcommand(args: argparse.Namespace) -> int:
    if args.command in ("evaluate", "predict"):
        problem = plugins.allow_from_args(args, "the client")
        if problem:
            raise ClientError(problem, exit_code=EXIT_USAGE)
    if args.command == "evaluate":
        return run_evaluate(args)
    if args.command == "predict":
        print("\n".join(predict(args.model, args.data)))
        return 0
    if args.command == "export":
        print(f"wrote {export(args.model, args.out)}")
        return 0
    if args.command == "compare":
        return run_compare(args)
    if args.command == "sweep":
        return run_sweep(args)
    coordinators = coordinators_of(args)
    if args.command == "attach":
        with display.ProgressView(quiet=args.quiet or args.json) as view:
            status = attach(coordinators, args.run_id, view, args.poll, args.dead_after)
        display.print_status(status, args.json)
        return {"completed": 0, "cancelled": EXIT_CANCELLED}.get(status.state, EXIT_FAILURE)
    endpoint = coordinators.leader(args.connect_timeout)
    if args.command == "status":
        status = call(endpoint, "status", ttypes.StatusRequest(run_id=args.run_id))
        display.print_status(status, args.json)
    elif args.command == "runs":
        runs = call(endpoint, "list_runs", ttypes.ListRunsRequest()).runs
        if args.json:
            print(json.dumps([display.status_dict(r) for r in runs], indent=2))
        elif args.nodes:
            for status in runs:
                display.print_status(status, as_json=False)
        else:
            display.print_runs(runs)
    elif args.command == "cancel":
        done = call(endpoint, "cancel", ttypes.CancelRunRequest(run_id=args.run_id))
        print("cancelled" if done.cancelled else "the run had already ended")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """Score a model file; an option that does not apply to its kind is refused (exit 2)."""
    if is_generator(args.model):
        if args.data is not None:
            raise ClientError("--data applies to a classifier or regressor; a generator is "
                              "scored against "
                              "held-out MNIST (choose how many images with --n)",
                              exit_code=EXIT_USAGE)
        scores = evaluate_gan(args.model, args.n or DEFAULT_SCORED)
        print(json.dumps(scores) if args.json else
              "  ".join(f"{k} {v:.4g}" for k, v in scores.items()))
        return 0
    if args.n is not None:
        raise ClientError("--n applies to a generator; a model is scored on every example "
                          "of --data", exit_code=EXIT_USAGE)
    scores = evaluate(args.model, args.data)
    name = "error" if scores.get("metric") in (None, "error_rate") else scores["metric"]
    print(json.dumps(scores) if args.json else
          f"{name} {scores['error']:.4f}  loss {scores['loss']:.4f}  rows {scores['rows']}")
    return 0
