"""What makes a node unfit for a run, in one line each; and model files for plain torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from thrift_trainer.client.model_commands import ModelCommandError, export
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.outputs.model_file import OPTIMIZER_PREFIX, save_model
from thrift_trainer.training.outputs.torch_files import load_weights, read_safetensors
from thrift_trainer.training.run_check import RunFacts, RunUnfit, run_facts, unfit_reason
from thrift_trainer.training.spec import RunSpec

SPEC = RunSpec.parse("sync_sgd", "my_models:Net", "letters", "{}")
OURS = RunFacts({"my_models": "1.0"}, "m1", "d1", 100)


def test_a_node_that_builds_the_same_model_and_data_can_serve_the_run():
    assert unfit_reason(OURS, RunFacts({"my_models": "1.0"}, "m1", "d1", 100), SPEC) is None
    assert unfit_reason(OURS.expectation(), RunFacts({}, "m1", "d1", 100), SPEC) is None


@pytest.mark.parametrize(("theirs", "words"), [
    (RunFacts({}, "m2", "d1", 100), "builds model my_models:Net with other parameters"),
    (RunFacts({}, "m1", "d1", 99), "99 training examples, the coordinator's 100"),
    (RunFacts({}, "m1", "d2", 100), "its files differ from the coordinator's"),
])
def test_a_node_with_another_model_or_data_is_unfit_and_told_why(theirs, words):
    assert words in unfit_reason(OURS, theirs, SPEC)


def test_a_built_in_run_expects_nothing_of_its_nodes():
    built_in = RunSpec.parse("delta_avg", "mlp", "letters", "{}")
    assert RunFacts().expectation() == {}
    assert unfit_reason(RunFacts(), RunFacts(), SPEC) is None
    # plug-ins a node allows that the run does not name are its own affair
    assert unfit_reason(RunFacts({"x": "1"}), RunFacts({"x": "2"}), built_in) is None


@pytest.mark.parametrize("expected", [OURS, OURS.expectation()])  # checked, or by a unit
def test_a_node_running_another_version_of_a_named_plug_in_is_unfit(expected):
    """The parameters agree (an edited forward() changes none), the code does not."""
    edited = RunFacts({"my_models": "sha256:0badc0de"}, "m1", "d1", 100)
    reason = unfit_reason(expected, edited, SPEC)
    assert reason == ("runs another version of plug-in my_models (sha256:0badc0de, the "
                      "coordinator's 1.0): give every process the same file or package, and "
                      "restart the ones that run the old one")
    plugin_algorithm = RunSpec.parse("my_algos:Avg", "mlp", "letters", "{}")  # no torch model
    assert "another version of plug-in my_algos" in unfit_reason(
        RunFacts({"my_algos": "2"}), RunFacts({"my_algos": "3"}), plugin_algorithm)


def test_a_process_lacking_a_plug_in_the_run_names_says_which_and_how_to_allow_it():
    with pytest.raises(RunUnfit, match="lacks plug-in my_models: it allows no plug-in module; "
                                       "start it with --plugins my_models$"):
        run_facts(SPEC, DEFAULT_DATA_ROOT / "letters")


def test_the_letters_mlp_and_the_gans_expect_no_fingerprints():
    spec = RunSpec.parse("delta_avg", "mlp", "letters", json.dumps({"epochs": 1}))
    assert run_facts(spec, DEFAULT_DATA_ROOT / "letters").expectation() == {}


def test_export_writes_safetensors_without_the_optimizer_and_refuses_to_overwrite(tmp_path):
    weights = {"0.weight": np.ones((2, 3), np.float32), "0.bias": np.zeros(2, np.float32)}
    source = save_model(tmp_path / "checkpoint.npz",
                        {**weights, OPTIMIZER_PREFIX + "m": np.ones(1)}, {"model": "x:Net"})
    path = export(str(source))
    tensors, metadata = read_safetensors(path)
    assert set(tensors) == set(weights) and metadata["model"] == "x:Net"
    module = torch.nn.Sequential(torch.nn.Linear(3, 2))
    module.load_state_dict({k: torch.from_numpy(v) for k, v in load_weights(path).items()},
                           strict=True)
    assert json.loads(metadata["description"]) == {"model": "x:Net"}
    with pytest.raises(ModelCommandError, match="would overwrite"):
        export(str(source), str(source))


def test_weights_load_from_a_torch_state_dict_file(tmp_path):
    module = torch.nn.Linear(2, 2)
    torch.save(module.state_dict(), tmp_path / "w.pt")
    loaded = load_weights(tmp_path / "w.pt")
    assert np.array_equal(loaded["weight"], module.weight.detach().numpy())


def _small_letters(folder, rows):
    """A letters-format copy of the shipped data, ``rows`` lines of each file."""
    folder.mkdir(exist_ok=True)
    for source in sorted((DEFAULT_DATA_ROOT / "letters").iterdir()):
        lines = source.read_text().splitlines()[:rows]
        (folder / source.name).write_text("\n".join(lines) + "\n")
    return folder


def test_a_copy_of_the_data_changed_while_the_process_runs_is_fingerprinted_again(tmp_path):
    """A long-lived node that fixed (or replaced) its copy is no longer left out, and the
    coordinator records the new size: its facts are not cached for its lifetime."""
    spec = RunSpec.parse("delta_avg", "mlp_classifier", "letters", json.dumps({"epochs": 1}))
    folder = _small_letters(tmp_path / "letters", 40)
    before = run_facts(spec, folder)
    _small_letters(folder, 60)
    after = run_facts(spec, folder)
    assert (before.data_size, after.data_size) == (before.data_size, before.data_size * 3 // 2)
    assert after.data_fingerprint != before.data_fingerprint
    assert run_facts(spec, folder) == after  # unchanged files: the same facts
