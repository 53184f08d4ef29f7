"""Every numeric option of the three commands refuses bad numbers with a usage error.

The test walks the parsers themselves, so an option added later with a bare `type=int`
or `type=float` (which accept nan, inf and negative values) fails here.
"""

from __future__ import annotations

import argparse
import re
import sys

import pytest

from thrift_trainer.client import cli as client_cli
from thrift_trainer.compute_node import cli as node_cli
from thrift_trainer.coordinator import cli as coordinator_cli
from thrift_trainer.training.models.names import GAN_MODELS

# Options where 0 is meaningful: any free port, no limit, no delay, from the first unit.
ZERO_ALLOWED = {"port:listen", "--max-update-norm", "--load-delay", "--crash-after-units",
                "--hang-after-units", "--corrupt-after-units", "--seed", "load_prob",
                "--server-momentum", "--wait-for-nodes", "--idle-timeout", "--dashboard-port",
                "--link-delay-ms", "--members-port"}
BAD_FOR_ALL = ["nan", "inf", "-inf", "-3", "abc", "1e400", ""]


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _client_subcommand(name: str) -> argparse.ArgumentParser:
    return dict(_subparsers(client_cli.build_subcommand_parser()))[name]


# (name, parser, valid positionals in order, whether its "port" positional is a listen port)
PARSERS = [
    ("coordinator", coordinator_cli.build_parser(), ["9095", "2"], True),
    ("node", node_cli.build_parser(), ["9091", "0.2"], True),
    ("pull node", node_cli.build_parser(pull=True), ["0.2"], True),
    ("client train", client_cli.build_train_parser(), ["h", "9095", "letters", "1", "1", "20",
                                                       "0.1"], False),
    ("client --config", client_cli.build_train_parser(with_config=True), ["h", "9095"], False),
    ("client status", _client_subcommand("status"), ["h", "9095"], False),
    ("client runs", _client_subcommand("runs"), ["h", "9095"], False),
    ("client attach", _client_subcommand("attach"), ["h", "9095"], False),
    ("client cancel", _client_subcommand("cancel"), ["h", "9095", "r1"], False),
    ("client evaluate", _client_subcommand("evaluate"), ["m.npz"], False),
    ("client predict", _client_subcommand("predict"), ["m.npz", "d.csv"], False),
]


def _numeric_actions() -> list[tuple[str, argparse.ArgumentParser, list[str], str, bool, str]]:
    """(parser name, parser, positionals, option, is positional, key) of every option
    whose value is converted by a type (a number, not free text)."""
    found = []
    for name, parser, positionals, listens in PARSERS:
        for action in parser._actions:
            if action.type is None:
                continue
            option = action.option_strings[0] if action.option_strings else action.dest
            if option in ("--pull", "--register", "--hidden", "--clients"):
                continue  # HOST:PORT, size and index lists: checked by their own tests
            key = "port:listen" if option == "port" and listens else option
            found.append((name, parser, positionals, option, not action.option_strings, key))
    return found


NUMERIC = _numeric_actions()


def _argv(parser_positionals: list[str], positional_dests: list[str], option: str,
          is_positional: bool, value: str) -> list[str]:
    if is_positional:
        return [value if dest == option else given
                for dest, given in zip(positional_dests, parser_positionals, strict=False)]
    return [*parser_positionals, f"{option}={value}"]


def _bad_values(key: str, is_positional: bool) -> list[str]:
    # argparse reads "-inf" as an unknown option, never as a positional's value
    bad = [v for v in BAD_FOR_ALL if not (is_positional and v == "-inf")]
    if key not in ZERO_ALLOWED:
        bad.append("0")
    if key.startswith("port"):
        bad.append("70000")
    return bad


def _cases() -> list:
    return [pytest.param(parser, positionals, option, is_positional, value,
                         id=f"{name} {option}={value!r}")
            for name, parser, positionals, option, is_positional, key in NUMERIC
            for value in _bad_values(key, is_positional)]


def test_the_walk_finds_the_numeric_options():
    options = {(name, option) for name, _, _, option, _, _ in NUMERIC}
    for expected in [("coordinator", "port"), ("coordinator", "--grace"),
                     ("coordinator", "--heartbeat"), ("coordinator", "--threads"),
                     ("coordinator", "--rpc-timeout"), ("coordinator", "--max-frame-mb"),
                     ("node", "load_prob"), ("node", "--retry-for"), ("pull node", "--seed"),
                     ("client train", "eta"), ("client train", "--server-momentum"),
                     ("client status", "port"), ("client evaluate", "--n")]:
        assert expected in options


def test_no_option_takes_a_bare_int_or_float():
    for name, parser, _, _ in PARSERS:
        for action in parser._actions:
            assert action.type not in (int, float), f"{name} {action.dest}: bare {action.type}"


@pytest.mark.parametrize("parser, positionals, option, is_positional, value", _cases())
def test_a_bad_number_is_a_usage_error_naming_the_option(parser, positionals, option,
                                                         is_positional, value, capsys):
    dests = [a.dest for a in parser._actions if not a.option_strings
             and not isinstance(a, argparse._SubParsersAction)]
    argv = _argv(positionals, dests, option, is_positional, value)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err, err


@pytest.mark.parametrize("name, parser, positionals, listens", PARSERS,
                         ids=[p[0] for p in PARSERS])
def test_the_valid_positionals_parse(name, parser, positionals, listens):
    parser.parse_args(positionals)


@pytest.mark.parametrize("argv", [["0", "2"], ["65535", "2", "--max-update-norm", "0",
                                                "--grace", "0.5", "--seed", "0"]])
def test_edge_values_are_accepted(argv):
    coordinator_cli.build_parser().parse_args(argv)


def test_the_train_help_names_every_action_the_choices_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        client_cli.main(["--help"])
    text = capsys.readouterr().out
    assert "{status,runs,attach,cancel,evaluate,predict,export,compare,sweep}" in text
    assert "--algorithm {delta_avg}" in text and "--model {mlp}" in text
    assert "Exit codes:" in text and "3 the run was cancelled" in text


@pytest.mark.parametrize("command", ["status", "runs"])
def test_status_and_runs_have_no_progress_display_to_quieten(command, capsys):
    with pytest.raises(SystemExit) as info:
        client_cli.main([command, "h", "9095", "--quiet"])
    assert info.value.code == 2 and "unrecognized arguments: --quiet" in capsys.readouterr().err


def test_evaluate_refuses_an_option_that_does_not_apply_to_the_model(tmp_path, capsys):
    from thrift_trainer.training.models import mlp
    from thrift_trainer.training.outputs.model_file import save_model

    spec = mlp.MLPSpec()
    model = save_model(tmp_path / "m.npz", mlp.init_params(spec),
                       {"model": "mlp", "spec": spec.to_dict()})
    assert client_cli.main(["evaluate", str(model), "--n", "100"]) == 2
    assert "--n applies to a generator" in capsys.readouterr().err
    assert client_cli.main(["evaluate", str(model)]) == 0
    assert capsys.readouterr().out.startswith("error ")


DEFAULT_ONLY = re.compile(r"^\s*\(default[^)]*\)\s*$")


@pytest.mark.parametrize("name, parser, positionals, listens", PARSERS,
                         ids=[p[0] for p in PARSERS])
def test_every_option_says_what_it_does_not_only_its_default(name, parser, positionals,
                                                             listens):
    for action in parser._actions:
        if action.help not in (None, argparse.SUPPRESS):
            assert not DEFAULT_ONLY.match(action.help), f"{name} {action.option_strings}"


def test_the_clients_help_lists_its_exit_codes_sigterm_included():
    text = client_cli.build_train_parser().format_help()
    for code in ("0", "1", "2", "3", "130", "143"):
        assert re.search(rf"\b{code} ", text), code
    assert "SIGTERM" in text


def test_the_clients_help_names_every_gan_model() -> None:
    wrapped = client_cli.build_train_parser().format_help()
    text = re.sub(r"-\s+", "-", " ".join(wrapped.split()))  # lines joined, hyphens too
    for model in GAN_MODELS:
        assert model in text, model


def test_an_installed_command_names_itself_in_its_usage(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/trainer-client", "--help"])
    assert client_cli.build_train_parser().format_usage().startswith("usage: trainer-client ")
    monkeypatch.setattr(sys, "argv", ["client.py"])
    assert client_cli.build_train_parser().format_usage().startswith("usage: client.py ")
