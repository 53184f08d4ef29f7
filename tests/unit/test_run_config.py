"""Run configuration: defaults, recipes, --set overrides, their errors, and the client forms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from thrift_trainer.client import cli
from thrift_trainer.training.algorithms.delta_avg import DeltaAveraging
from thrift_trainer.training.run_config import CONFIG_FILE, RunConfigError, load_run_config
from thrift_trainer.training.schema import AggregationSettings, DeltaAvgSettings, defaults

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "configs").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: str | Path | None, overrides: list[str] | None = None) -> str:
    with pytest.raises(RunConfigError) as caught:
        load_run_config(path, overrides or [])
    return str(caught.value)


# ------------------------------------------------------------------ loading and merging
def test_defaults_are_the_assignment_run():
    config = load_run_config(None, [])
    assert (config.algorithm, config.model, config.dataset, config.rounds) == (
        "delta_avg", "mlp", "letters", 5)
    assert config.seed == 1 and config.deterministic is False
    assert config.outputs == {"sample_every": 1, "checkpoint_every": 1, "eval_every": 1,
                              "eval_n": 2000}
    assert config.algorithm_config()["eta"] is None  # the model's default: the MLP's here
    assert DeltaAveraging.check_config("mlp", config.algorithm_config())["eta"] == 0.0001
    assert config.section("sync_sgd")["num_workunits_per_update"] == 3


def test_every_default_key_has_a_one_line_comment():
    lines = [line for line in CONFIG_FILE.read_text().splitlines()
             if re.match(r"  [a-z_0-9]+:", line)]  # key lines; comments may go on below
    keys = sum(len(section) for section in yaml.safe_load(CONFIG_FILE.read_text()).values())
    assert len(lines) == keys
    assert all("# " in line for line in lines)


def test_delta_avg_section_matches_the_algorithm_defaults():
    config = load_run_config(None, [])
    assert list(config.section("delta_avg")) == list(defaults(DeltaAvgSettings))
    by_model = {"epochs": None, "eta": None, "local_optimizer": None}  # the model's defaults
    assert config.section("delta_avg") == {**defaults(DeltaAvgSettings), **by_model}


def test_a_torch_model_left_to_the_defaults_gets_a_recipe_that_trains():
    """Not the letters MLP's full-batch descent at 0.0001 for 15 epochs, which leaves a
    torch model worse than chance: one epoch of Adam at 0.001 over minibatches."""
    config = load_run_config(None, ["run.model=my_models:Net"]).algorithm_config()
    checked = DeltaAveraging.check_config("my_models:Net", config)
    assert (checked["epochs"], checked["eta"], checked["local_optimizer"]) == (1, 0.001, "adam")
    mlp = DeltaAveraging.check_config("mlp", config)
    assert (mlp["epochs"], mlp["eta"], mlp["local_optimizer"]) == (15, 0.0001, "gd")
    given = load_run_config(None, ["run.model=my_models:Net", "delta_avg.eta=0.05"])
    assert DeltaAveraging.check_config("my_models:Net", given.algorithm_config())["eta"] == 0.05
    with pytest.raises(RunConfigError, match="delta_avg.eta must be a number"):
        load_run_config(None, ["delta_avg.eta=fast"])  # typed though null in config.yaml


def test_a_torch_run_records_and_sends_no_key_of_the_numpy_mlp():
    """hidden, compat and scale_features shape the letters MLP only: a torch model's run
    recorded them (run.json, the model's config) though nothing read them."""
    config = load_run_config(None, ["run.model=mlp_classifier"]).algorithm_config()
    checked = DeltaAveraging.check_config("mlp_classifier", config)
    assert not {"hidden", "compat", "scale_features"} & set(checked)
    # a node checks the config it is sent again: the same keys come back
    assert DeltaAveraging.check_config("mlp_classifier", checked) == checked
    mlp = DeltaAveraging.check_config("mlp", config)  # the letters MLP keeps them all
    assert (mlp["hidden"], mlp["compat"], mlp["scale_features"]) == ([20], False, False)


def test_a_recipe_overrides_only_its_keys():
    config = load_run_config(REPO / "configs" / "letters_recommended.yaml", [])
    section = config.algorithm_config()
    assert config.rounds == 10
    assert section["hidden"] == [128, 128] and section["local_optimizer"] == "adam"
    assert section["server_optimizer"] == "momentum" and section["server_momentum"] == 0.5
    assert section["server_lr"] == 1.0  # untouched: the default


def test_set_overrides_parse_yaml_values():
    config = load_run_config(REPO / "configs" / "letters_recommended.yaml", [
        "run.rounds=3", "delta_avg.eta=0.01", "delta_avg.compat=true",
        "delta_avg.hidden=[64, 32]", "delta_avg.server_lr=2", "delta_avg.local_optimizer=sgd",
    ])
    section = config.algorithm_config()
    assert config.rounds == 3
    assert section["eta"] == 0.01 and section["compat"] is True
    assert section["hidden"] == [64, 32] and section["local_optimizer"] == "sgd"
    assert section["server_lr"] == 2.0 and isinstance(section["server_lr"], float)


def test_later_overrides_win_and_exponents_are_numbers():
    config = load_run_config(None, ["delta_avg.eta=0.1", "delta_avg.eta=1e-3"])
    assert config.algorithm_config()["eta"] == 0.001


def test_null_algorithm_seed_takes_the_run_seed():
    assert load_run_config(None, ["run.seed=7"]).algorithm_config()["seed"] == 7
    explicit = load_run_config(None, ["run.seed=7", "delta_avg.seed=3"])
    assert explicit.algorithm_config()["seed"] == 3


def test_algorithm_config_is_the_chosen_section_and_json_ready():
    config = load_run_config(REPO / "configs" / "dcgan_mnist.yaml", [])
    assert config.algorithm == "sync_sgd" and config.model == "dcgan28-wide"
    assert config.algorithm_config() == {**config.section("sync_sgd"),
                                         "aggregation": config.section("aggregation")}
    assert json.loads(json.dumps(config.algorithm_config()))["images_per_work_unit"] == 32


def test_returned_sections_are_copies():
    config = load_run_config(None, [])
    config.algorithm_config()["hidden"].append(99)
    assert config.algorithm_config()["hidden"] == [20]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_loads(recipe):
    config = load_run_config(recipe, [])
    assert config.algorithm in ("delta_avg", "sync_sgd", "md_gan", "fl_gan")
    assert config.algorithm_config()


def test_the_named_recipes_exist():
    names = {recipe.stem for recipe in RECIPES}
    assert {"letters_assignment", "letters_recommended", "letters_sync_sgd", "dcgan_mnist",
            "dcgan_mnist_tiny"} <= names


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("override, suggestion", [
    ("delta_avg.etta=0.1", "'delta_avg.eta'"),
    ("rounds=3", "'run.rounds'"),
    ("dela_avg.eta=0.1", "'delta_avg.eta'"),
])
def test_unknown_key_names_it_and_suggests(override, suggestion):
    message = error_of(None, [override])
    assert f"unknown key {override.split('=')[0]!r}" in message
    assert f"did you mean {suggestion}" in message


def test_unknown_key_in_a_recipe_names_the_file(tmp_path):
    path = write(tmp_path, "delta_avg:\n  epoch: 3\n")
    message = error_of(path)
    assert "'delta_avg.epoch'" in message and str(path) in message and "'delta_avg.epochs'" \
        in message


@pytest.mark.parametrize("override, expected", [
    ("run.rounds=five", "run.rounds must be an integer"),
    ("run.rounds=2.5", "run.rounds must be an integer"),
    ("delta_avg.epochs=true", "delta_avg.epochs must be an integer"),
    ("delta_avg.compat=1", "delta_avg.compat must be a boolean"),
    ("delta_avg.eta=fast", "delta_avg.eta must be a number"),
    ("delta_avg.hidden=[1, 2.5]", "delta_avg.hidden must be a list of integers"),
    ("run.model=3", "run.model must be a string"),
])
def test_wrong_type_names_key_and_type(override, expected):
    assert expected in error_of(None, [override])


@pytest.mark.parametrize("override, expected", [
    ("delta_avg.eta", "expected section.key=value"),
    ("delta_avg=3", "'delta_avg' is a section"),
    ("delta_avg.hidden=[1,", "not a valid YAML value"),
    ("run.algorithm=adam", "run.algorithm must be one of delta_avg, sync_sgd"),
    ("run.rounds=0", "run.rounds: 0 is out of range 1..2147483647"),
])
def test_malformed_overrides_are_explained(override, expected):
    assert expected in error_of(None, [override])


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "run:\n  rounds: 3\n  model: [mlp\n")
    message = error_of(path)
    assert str(path) in message and "line " in message and "invalid YAML" in message


def test_a_key_given_twice_is_an_error_with_its_line(tmp_path):
    path = write(tmp_path, "delta_avg:\n  eta: 0.1\n  eta: 0.2\n")
    message = error_of(path)
    assert str(path) in message and "line 3" in message and "given twice" in message


def test_missing_file_names_the_path(tmp_path):
    message = error_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "cannot read" in message


@pytest.mark.parametrize("text, expected", [
    ("- run\n", "expected sections"),
    ("run: 3\n", "run must be a section of keys"),
])
def test_recipe_shape_errors(tmp_path, text, expected):
    assert expected in error_of(write(tmp_path, text))


def test_an_empty_recipe_is_the_defaults(tmp_path):
    assert load_run_config(write(tmp_path, "# nothing\n"), []) == load_run_config(None, [])


# ------------------------------------------------------------------------- the client
def test_client_positional_form_is_unchanged():
    args = cli.parse_train_args(["localhost", "9095", "letters", "5", "15", "20", "0.0001",
                                 "--compat"])
    request = cli.train_request(args, "r1")
    assert (request.algorithm, request.model, request.dataset, request.rounds) == (
        "delta_avg", "mlp", "letters", 5)
    assert json.loads(request.config_json) == cli.train_config(args)
    assert json.loads(request.config_json)["compat"] is True


def test_client_config_form_builds_the_request_from_the_file():
    recipe = str(REPO / "configs" / "letters_recommended.yaml")
    args = cli.parse_train_args(["localhost", "9095", "--config", recipe, "--set",
                                 "delta_avg.eta=0.01", "--set", "run.rounds=3", "--quiet"])
    request = cli.train_request(args, "r2")
    expected = load_run_config(recipe, ["delta_avg.eta=0.01", "run.rounds=3"])
    assert (request.algorithm, request.dataset, request.rounds) == ("delta_avg", "letters", 3)
    assert json.loads(request.config_json) == expected.algorithm_config()
    assert args.quiet


def test_set_reaches_a_key_inside_a_mapping_valued_key():
    args = cli.parse_train_args(["localhost", "9095", "--set", "run.algorithm=my_algos:Prox",
                                 "--set", "run.algorithm_args.mu=0",
                                 "--set", "run.algorithm_args.inner.lr=0.5"])
    config = json.loads(cli.train_request(args, "r3").config_json)
    assert config["mu"] == 0 and config["inner"] == {"lr": 0.5}
    config = load_run_config(None, ["run.model=mlp_classifier", "run.model_args.width=8",
                                    "data.args.n=3"])
    assert config.algorithm_config()["model"] == {"args": {"width": 8}}
    assert config.section("data")["args"] == {"n": 3}


def test_nested_set_is_refused_where_there_is_no_mapping():
    assert error_of(None, ["run.model_args.a=1", "run.model_args.a.b=2"]) == (
        "--set run.model_args.a.b=2: run.model_args.a is 1, not a mapping of keys")
    assert error_of(None, ["run.model_args..b=2"]) == (
        "--set run.model_args..b=2: an empty key in run.model_args..b")
    assert error_of(None, ["delta_avg.eta.x=1"]).startswith("unknown key 'delta_avg.eta.x'")


def test_client_accepts_an_unambiguous_prefix_of_config():
    args = cli.parse_train_args(["localhost", "9095", "--conf=config.yaml"])
    assert args.config == "config.yaml"


@pytest.mark.parametrize("argv, expected", [
    (["localhost", "9095", "letters", "5"], "or give the run as --config PATH"),
    (["localhost", "9095"], "required: data_dir"),
    (["localhost", "9095", "--config", "config.yaml", "letters", "5"], "--set"),
    (["localhost", "9095", "--config", "config.yaml", "--compat"], "unrecognized"),
    (["localhost", "9095", "letters", "5", "15", "20", "0.1", "--set", "run.rounds=2"],
     "unrecognized arguments: letters 5 15 20 0.1"),
])
def test_client_usage_errors_exit_2(capsys, argv, expected):
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and expected in err


def test_client_bad_config_is_one_line_and_exit_2(capsys, tmp_path):
    argv = ["localhost", "9095", "--config", str(REPO / "config.yaml"), "--set",
            "delta_avg.etaa=1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown key 'delta_avg.etaa'") and err.count("\n") == 1
    assert cli.main(["localhost", "9095", "--config", str(tmp_path / "x.yaml")]) == 2
    assert "x.yaml" in capsys.readouterr().err


def test_sync_sgd_section_matches_the_algorithm_for_every_model():
    from thrift_trainer.training.algorithms.sync_sgd import ALL_KEYS, SyncSGD, defaults_for

    section = load_run_config(None, []).section("sync_sgd")
    assert set(section) == ALL_KEYS
    for model in ("mlp", "dcgan28"):
        checked = SyncSGD.check_config(model, section)
        assert checked == {**defaults_for(model), "seed": 1,
                           "aggregation": defaults(AggregationSettings)}
