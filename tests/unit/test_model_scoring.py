"""A torch model's file records how its data was read and preprocessed (both the .npz
description and model.safetensors' metadata), and `client.py evaluate` / `predict` apply
that record: evaluate scores what the coordinator scored, predict names the labels, and a
file without the record is refused in one line."""

from __future__ import annotations

import json
import string
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from thrift_trainer.client import cli as client_cli
from thrift_trainer.client.model_commands import ModelCommandError, evaluate, export, predict
from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import torch_model
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.data.preprocessing import PIXELS
from thrift_trainer.training.models import modules
from thrift_trainer.training.outputs.model_file import load_model, save_model
from thrift_trainer.training.outputs.torch_files import read_safetensors, save_safetensors

KINDS = ("ant", "bee", "cow")
PLUGIN = textwrap.dedent('''
    from torch import nn


    def tiny(in_features, num_classes, width=8):
        return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(),
                             nn.Linear(width, num_classes))
    ''')


@pytest.fixture
def table(tmp_path):
    """A CSV data set with a header, word labels and features on different scales."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "animals"
    folder.mkdir()
    for name, rows in (("train.csv", 60), ("held.csv", 30)):
        kinds = rng.integers(0, 3, rows)
        lines = ["size,legs,kind"] + [
            f"{100 * k + rng.normal():.3f},{k * 2 + rng.normal():.3f},{KINDS[k]}"
            for k in kinds]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def _trained(model: str, folder, data: dict, args: dict | None = None):
    """The coordinator's model of a run on ``folder``, with its validation score."""
    config = {"model": {"args": args or {}}, "data": data}
    setup = torch_model.setup_of(model, config, folder.name, folder)
    state = torch_model.CoordinatorModel(setup, seed=1, batch_size=8)
    weights = state.weights()
    return weights, state.description(), state.evaluate(weights)


def _saved(tmp_path, weights, description) -> tuple:
    """The model as the coordinator writes it: model.npz and model.safetensors."""
    npz = save_model(tmp_path / "model.npz", weights, description)
    st = save_safetensors(tmp_path / "model.safetensors", weights,
                          {"model": description["model"], "description": description})
    return str(npz), str(st)


TABLE = {"format": "csv", "label": "kind", "validation": "held.csv", "normalize": True}


def test_a_table_models_file_records_its_columns_statistics_and_label_names(table,
                                                                              tmp_path):
    weights, description, scored = _trained("mlp_classifier", table, TABLE)
    npz, st = _saved(tmp_path, weights, description)
    record = description["data"]
    assert record["format"] == "csv" and record["columns"] == ["size", "legs"]
    assert record["label_names"] == list(KINDS) and record["label_column"] == 2
    mean, std = record["normalize"]["mean"], record["normalize"]["std"]
    assert len(mean) == len(std) == 2 and mean[0] > 50  # the raw size column's scale
    assert description["model"] == "mlp_classifier" and description["num_classes"] == 3
    # both files carry the same record
    assert load_model(npz)[1]["data"] == record
    assert json.loads(read_safetensors(st)[1]["description"])["data"] == record

    for path in (npz, st):
        scores = evaluate(path, str(table / "held.csv"))
        assert scores["metric"] == "error_rate" and scores["rows"] == 30
        assert scores["error"] == pytest.approx(scored.validation_error, abs=1e-6)
        assert scores["loss"] == pytest.approx(scored.validation_loss, abs=1e-6)


def test_predict_names_the_labels_and_takes_rows_with_or_without_the_label(table, tmp_path):
    weights, description, _ = _trained("mlp_classifier", table, TABLE)
    npz, _ = _saved(tmp_path, weights, description)
    with_labels = predict(npz, str(table / "held.csv"))
    assert len(with_labels) == 30 and set(with_labels) <= set(KINDS)
    # the feature columns by name, in another order, no label; and a file without a header
    (tmp_path / "new.csv").write_text("legs,size\n0.1,1.0\n4.2,199.0\n")
    (tmp_path / "bare.csv").write_text("1.0,0.1\n199.0,4.2\n")
    assert predict(npz, str(tmp_path / "new.csv")) == predict(npz, str(tmp_path / "bare.csv"))
    (tmp_path / "wrong.csv").write_text("size,wings\n1,2\n")
    with pytest.raises(ModelCommandError, match="no column 'legs'"):
        predict(npz, str(tmp_path / "wrong.csv"))


def test_a_plug_in_model_is_scored_once_its_module_is_allowed(table, tmp_path, monkeypatch,
                                                              capsys):
    (tmp_path / "tiny_models.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    plugins.reset()
    try:
        plugins.allow(["tiny_models"], tmp_path)
        weights, description, scored = _trained("tiny_models:tiny", table, TABLE,
                                                {"width": 4})
        npz, _ = _saved(tmp_path, weights, description)
        assert description["model_args"] == {"width": 4}
        plugins.reset()
        with pytest.raises(ModelCommandError, match="--plugins tiny_models"):
            evaluate(npz, str(table / "held.csv"))
        capsys.readouterr()
        code = client_cli.main(["evaluate", npz, "--data", str(table / "held.csv"), "--json",
                                "--plugins", "tiny_models"])
        assert code == 0
        scores = json.loads(capsys.readouterr().out)
        assert scores["error"] == pytest.approx(scored.validation_error, abs=1e-6)
    finally:
        plugins.reset()


def test_an_image_models_file_records_size_channels_scaling_and_classes(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "shapes"
    for part, count in (("train", 6), ("validation", 4)):
        for label, shade in (("dark", 40), ("light", 210)):
            (folder / part / label).mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(shade + rng.normal(0, 20, (10, 12, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / part / label / f"{i}.png")
    data = {"format": "images", "image_size": 8, "channels": 3}
    weights, description, scored = _trained("mlp_classifier", folder, data)
    npz, st = _saved(tmp_path, weights, description)
    record = description["data"]
    assert (record["image_size"], record["channels"], record["pixels"]) == (8, 3, PIXELS)
    assert record["label_names"] == ["dark", "light"] and PIXELS == "[-1, 1]"
    scores = evaluate(st, str(folder / "validation"))
    assert scores["error"] == pytest.approx(scored.validation_error, abs=1e-6)
    lines = predict(npz, str(folder / "validation" / "dark"))
    assert len(lines) == 4 and all(line.split("\t")[1] in ("dark", "light") for line in lines)
    assert lines[0].startswith(str(folder / "validation" / "dark"))


def test_a_torch_models_file_without_the_data_record_is_refused_in_one_line(table, tmp_path):
    weights, description, _ = _trained("mlp_classifier", table, TABLE)
    older = {k: v for k, v in description.items() if k != "data"}
    npz = str(save_model(tmp_path / "older.npz", weights, older))
    for command in (lambda: evaluate(npz, str(table / "held.csv")),
                    lambda: predict(npz, str(table / "held.csv"))):
        with pytest.raises(ModelCommandError) as info:
            command()
        assert "lacks the data record" in str(info.value) and "\n" not in str(info.value)
    partial = {**description, "data": {k: v for k, v in description["data"].items()
                                       if k != "columns"}}
    npz = str(save_model(tmp_path / "partial.npz", weights, partial))
    with pytest.raises(ModelCommandError, match="lacks the data record's columns"):
        evaluate(npz, str(table / "held.csv"))
    plugin = {**description, "data": {"format": "plugin", "dataset": "my_data:make"}}
    npz = str(save_model(tmp_path / "plugin.npz", weights, plugin))
    with pytest.raises(ModelCommandError, match="plug-in data set my_data:make"):
        predict(npz, str(table / "held.csv"))


def test_a_safetensors_file_without_a_description_is_refused(tmp_path):
    path = save_safetensors(tmp_path / "plain.safetensors", {"w": np.zeros(2, np.float32)},
                            {})
    with pytest.raises(ModelCommandError, match="no model description in its metadata"):
        evaluate(str(path), None)


def test_export_keeps_the_record_in_the_metadata(table, tmp_path):
    weights, description, _ = _trained("mlp_classifier", table, TABLE)
    npz, _ = _saved(tmp_path, weights, description)
    exported = export(npz, str(tmp_path / "exported.safetensors"))
    tensors, metadata = read_safetensors(exported)
    assert json.loads(metadata["description"])["data"] == description["data"]
    assert set(tensors) == set(weights)
    assert torch.equal(torch.from_numpy(tensors["1.weight"]),
                       torch.from_numpy(weights["1.weight"]))


@pytest.mark.parametrize("dataset, data, evaluated_on", [
    ("letters", {"format": "letters", "normalize": True}, None),
    ("mnist", {}, "mnist"),
], ids=["letters-default-data", "mnist-held-out-part"])
def test_the_shipped_data_sets_are_scored_as_the_coordinator_scored_them(dataset, data,
                                                                        evaluated_on,
                                                                        tmp_path):
    folder = DEFAULT_DATA_ROOT / dataset
    weights, description, scored = _trained("mlp_classifier", folder, data, {"hidden": [8]})
    npz, _ = _saved(tmp_path, weights, description)
    scores = evaluate(npz, str(folder) if evaluated_on else None)
    assert scores["error"] == pytest.approx(scored.validation_error, abs=1e-6)
    assert scores["loss"] == pytest.approx(scored.validation_loss, abs=1e-6)
    names = description["data"]["label_names"]
    assert names == (list(string.ascii_uppercase) if dataset == "letters" else None)
    if dataset == "letters":  # rows of 16 features, a label column or not: letters back
        rows = (folder / "validate_letters.txt").read_text().splitlines()[:5]
        (tmp_path / "rows.csv").write_text("\n".join(r.rsplit(",", 1)[0] for r in rows))
        predicted = predict(npz, str(tmp_path / "rows.csv"))
        assert predicted == predict(npz, str(folder / "validate_letters.txt"))[:5]
        assert len(predicted) == 5 and set(predicted) <= set(string.ascii_uppercase)


def test_evaluate_without_data_is_bad_arguments_for_a_table_model(table, tmp_path, capsys):
    weights, description, _ = _trained("mlp_classifier", table, TABLE)
    npz, _ = _saved(tmp_path, weights, description)
    assert client_cli.main(["evaluate", npz]) == 2
    assert "give --data PATH" in capsys.readouterr().err
    assert client_cli.main(["predict", npz, str(table / "held.csv")]) == 0
    assert set(capsys.readouterr().out.split()) <= set(KINDS)


def test_a_scalar_tensor_keeps_its_shape_in_a_safetensors_file(tmp_path):
    # BatchNorm's num_batches_tracked is 0-d: the module refuses it as shape (1,)
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    weights = {name: value.numpy() for name, value in module.state_dict().items()}
    path = save_safetensors(tmp_path / "model.safetensors", weights, {})
    tensors, _ = read_safetensors(path)
    assert tensors["1.num_batches_tracked"].shape == ()
    modules.load_arrays(module, tensors)
