"""Delta averaging (FedAvg) over the letters shards in one process, one line per round.

    python scripts/simulate_letters.py --preset compat --rounds 25
    python scripts/simulate_letters.py --preset recommended

The maths are training/baselines/simulate.py's: the yardstick the distributed run must match.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from thrift_trainer.training.baselines.simulate import (  # noqa: E402
    DEFAULT_DATA_DIR,
    PRESETS,
    run_delta_averaging,
)
from thrift_trainer.training.models.mlp import OPTIMIZERS, LocalTraining, MLPSpec  # noqa: E402
from thrift_trainer.training.server_optim import (  # noqa: E402
    SERVER_OPTIMIZERS,
    ServerOptimizer,
    make_server_optimizer,
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python scripts/simulate_letters.py",
        description="Delta averaging (FedAvg) over the letters shards in one process. "
        "A preset fills every option; options given explicitly override it.",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="compat")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--hidden", type=int, nargs="+", help="hidden widths, e.g. 256 256")
    parser.add_argument("--compat", action=argparse.BooleanOptionalAction)
    parser.add_argument("--scale-features", action=argparse.BooleanOptionalAction)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--eta", type=float)
    parser.add_argument("--optimizer", choices=OPTIMIZERS)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--shuffle-seed", type=int, help="LocalTraining.seed")
    parser.add_argument("--server", choices=sorted(SERVER_OPTIMIZERS))
    parser.add_argument(
        "--server-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="server optimizer option, e.g. lr=1.0 or beta=0.9 (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=1, help="initialisation seed")
    return parser.parse_args(argv)


def _configure(args: argparse.Namespace) -> tuple[MLPSpec, LocalTraining, ServerOptimizer, int]:
    """The preset, overridden by every option given on the command line."""
    preset = PRESETS[args.preset]
    spec = replace(
        preset.spec,
        **_given(args, hidden="hidden", compat="compat", scale_features="scale_features"),
    )
    opt = replace(
        preset.opt,
        **_given(
            args,
            epochs="epochs",
            eta="eta",
            optimizer="optimizer",
            batch_size="batch_size",
            seed="shuffle_seed",
        ),
    )
    name, options = preset.server, dict(preset.server_options)
    if args.server is not None and args.server != name:
        name, options = args.server, {}  # the preset's options belong to its own optimizer
    for item in args.server_opt:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--server-opt expects KEY=VALUE, got {item!r}")
        options[key] = float(value)
    server = make_server_optimizer(name, **options)
    rounds = args.rounds if args.rounds is not None else preset.rounds
    return spec, opt, server, rounds


def _given(args: argparse.Namespace, **fields: str) -> dict[str, object]:
    """{dataclass field: value} for the command-line options that were given."""
    given = {key: getattr(args, option) for key, option in fields.items()}
    if given.get("hidden") is not None:
        given["hidden"] = tuple(given["hidden"])
    return {key: value for key, value in given.items() if value is not None}


def main(argv: list[str] | None = None) -> int:
    """Print the configuration, then one line per round as it finishes."""
    args = _parse_args(argv)
    try:
        spec, opt, server, rounds = _configure(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"spec   {spec.to_dict()}\nlocal  {opt.to_dict()}\nserver {server.config()}")
    print(f"{'round':>5}  {'val_error':>9}  {'val_loss':>8}  {'elapsed_s':>9}")
    start = time.perf_counter()

    def show(round_index: int, error: float, loss: float) -> None:
        elapsed = time.perf_counter() - start
        print(f"{round_index:5d}  {error:9.4f}  {loss:8.4f}  {elapsed:9.2f}", flush=True)

    run_delta_averaging(args.data_dir, rounds, spec, opt, server, args.seed, on_round=show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
