"""Client subcommands that use a saved model locally: evaluate, predict and export.

A model file is this project's .npz (a model or a run's checkpoint) or a
``.safetensors`` file it wrote (the description in its metadata). The letters MLP and the
generators are scored here; torch models (``mlp_classifier``, plug-ins) by
client/torch_scoring.py, which imports torch only when one is used.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import numpy as np

from thrift_trainer.training.data.letters import DataFormatError, load_letters
from thrift_trainer.training.data.paths import DEFAULT_DATA_ROOT
from thrift_trainer.training.models import mlp
from thrift_trainer.training.outputs.model_file import ModelFileError, load_model, without_optimizer
from thrift_trainer.training.outputs.torch_files import read_safetensors, save_safetensors

LETTERS = string.ascii_uppercase
DEFAULT_VALIDATION = DEFAULT_DATA_ROOT / "letters" / "validate_letters.txt"


class ModelCommandError(Exception):
    """A model or data file the command cannot use; the message says which and why.
    ``exit_code``: 1, or 2 for arguments that do not fit the model."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def export(model_path: str, out: str | None = None) -> Path:
    """The model (or a checkpoint's model) of ``model_path`` as safetensors, which plain torch
    loads (training/outputs/torch_files.py); the description goes into its metadata."""
    weights, description = _load(model_path)
    target = Path(out) if out else Path(model_path).with_suffix(".safetensors")
    if target.resolve() == Path(model_path).resolve():
        raise ModelCommandError(f"--out {target} would overwrite the model it is made from")
    return export_weights(weights, description, target)


def export_weights(weights: dict[str, np.ndarray], description: dict[str, Any],
                   target: Path) -> Path:
    """The model (a checkpoint's optimizer state left out) as safetensors at ``target``,
    its description in the metadata."""
    try:
        return save_safetensors(target, without_optimizer(weights),
                                {"model": str(description.get("model", "")),
                                 "description": description})
    except OSError as exc:
        raise ModelCommandError(f"cannot write {target}: {exc.strerror or exc}") from None


def _load(model_path: str) -> tuple[dict[str, np.ndarray], dict]:
    try:
        if Path(model_path).suffix.lower() == ".safetensors":
            return _load_safetensors(model_path)
        return load_model(model_path)
    except ModelFileError as exc:
        raise ModelCommandError(str(exc)) from None


def _load_safetensors(model_path: str) -> tuple[dict[str, np.ndarray], dict]:
    """The weights and the description a safetensors file of this project keeps in its
    metadata (run_folder.finish, export)."""
    weights, metadata = read_safetensors(model_path)
    try:
        description = json.loads(metadata["description"])
    except KeyError:
        raise ModelCommandError(f"{model_path} has no model description in its metadata; "
                                "was it written by this trainer?") from None
    except ValueError:
        raise ModelCommandError(f"{model_path} is damaged: its model description is not "
                                "JSON") from None
    if not isinstance(description, dict):
        raise ModelCommandError(f"{model_path} is damaged: its model description is not a "
                                "JSON object")
    return weights, description


def _torch_or_none(model_path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The weights and description of a torch model's file; None for another model."""
    weights, description = _load(model_path)
    if description.get("model") == "mlp" or "gan" in description:
        return None
    if "model_args" not in description or "input_shape" not in description:
        return None
    return without_optimizer(weights), description


def _load_mlp(model_path: str) -> tuple[dict[str, np.ndarray], mlp.MLPSpec]:
    weights, description = _load(model_path)
    if description.get("model") != "mlp":
        raise ModelCommandError(
            f"{model_path} holds a {description.get('model')!r} model; these commands "
            "score the letters MLP and torch models (mlp_classifier, plug-ins)")
    # A run's checkpoint holds the server optimizer's state besides the model's weights.
    weights = without_optimizer(weights)
    try:
        spec = mlp.MLPSpec.from_dict(description["spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelCommandError(f"{model_path} is damaged: no valid MLP spec ({exc})") from None
    _check_shapes(model_path, weights, spec.layer_shapes())
    return weights, spec


def _check_shapes(model_path: str, weights: dict[str, np.ndarray],
                  shapes: dict[str, tuple[int, ...]]) -> None:
    """The weights must be exactly the spec's layers, or scoring fails half-way."""
    if set(weights) != set(shapes):
        raise ModelCommandError(f"{model_path} is damaged: it holds weights "
                                f"{sorted(weights)}, its spec needs {sorted(shapes)}")
    for name, shape in shapes.items():
        if weights[name].shape != shape or weights[name].dtype.kind not in "fiu":
            raise ModelCommandError(
                f"{model_path} is damaged: weight {name} is {weights[name].dtype} "
                f"{weights[name].shape}, its spec needs a number array {shape}")


def evaluate(model_path: str, data_path: str | None) -> dict[str, Any]:
    """The run's metric and mean loss of the model on labelled data: the letters MLP's
    error rate on a letters file (default: the letters validation file), a torch model's
    on data in the format it was trained on."""
    torch_model = _torch_or_none(model_path)
    if torch_model is not None:
        return _torch_call("evaluate", model_path, torch_model, _data_for(torch_model[1],
                                                                          data_path))
    weights, spec = _load_mlp(model_path)
    data_path = data_path or str(DEFAULT_VALIDATION)
    try:
        features, labels = load_letters(data_path)
    except (DataFormatError, OSError) as exc:
        raise ModelCommandError(str(exc)) from None
    error, loss = mlp.evaluate(weights, features, labels, spec)
    return {"error": float(error), "loss": float(loss), "rows": int(len(labels))}


def evaluate_gan(model_path: str, n: int) -> dict[str, float]:
    """IS and FID of a saved 28x28 generator (a model file or a checkpoint), with the
    project's frozen MNIST classifier against held-out MNIST images."""
    from thrift_trainer.training.models import gan_models
    from thrift_trainer.training.outputs import gan_metrics

    weights, description = _load(model_path)
    if "gan" not in description:
        raise ModelCommandError(f"{model_path} holds no generator")
    try:
        spec = gan_models.GanSpec.from_dict(description["gan"])
    except (TypeError, ValueError) as exc:
        raise ModelCommandError(f"{model_path} is damaged: no valid GAN spec ({exc})") from None
    if spec.arch not in gan_models.MNIST_ARCHITECTURES:
        raise ModelCommandError("IS/FID are computed for 28x28 MNIST generators only")
    g, _ = gan_models.build_gan(spec)
    try:
        gan_models.numpy_to_state(g, weights, "G.")
    except (TypeError, ValueError) as exc:
        raise ModelCommandError(f"{model_path} is damaged: {exc}") from None
    images = gan_models.sample_images(g, n, seed=gan_metrics.SCORE_SEED)
    try:
        return gan_metrics.score_images(images, n).to_dict()
    except ValueError as exc:
        raise ModelCommandError(str(exc)) from None


def is_generator(model_path: str) -> bool:
    return "gan" in _load(model_path)[1]


def predict(model_path: str, data_path: str) -> list[str]:
    """The letters MLP: the predicted letter of each row of a CSV of 16 features (a 17th
    label column is ignored). A torch model: one prediction per row or image of data in
    the format it was trained on, by label name when its file records them."""
    torch_model = _torch_or_none(model_path)
    if torch_model is not None:
        return _torch_call("predict", model_path, torch_model, data_path)
    weights, spec = _load_mlp(model_path)
    features = _read_features(Path(data_path), spec.n_in)
    return [LETTERS[i] for i in mlp.predict(weights, features, spec)]


def _data_for(description: dict[str, Any], data_path: str | None) -> str:
    """``--data``, which a torch model needs, unless it was trained on letters (whose
    validation file is the default)."""
    if data_path:
        return data_path
    if (description.get("data") or {}).get("format") == "letters":
        return str(DEFAULT_VALIDATION)
    raise ModelCommandError(f"evaluate {description.get('model')}: give --data PATH, "
                            "labelled data in the format it was trained on", exit_code=2)


def _torch_call(command: str, model_path: str,
                torch_model: tuple[dict[str, np.ndarray], dict[str, Any]], data_path: str
                ) -> Any:
    from thrift_trainer.client import torch_scoring  # torch is imported only for these

    try:
        return getattr(torch_scoring, command)(model_path, *torch_model, data_path)
    except torch_scoring.TorchScoringError as exc:
        raise ModelCommandError(str(exc)) from None


def _read_features(path: Path, n_in: int) -> np.ndarray:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ModelCommandError(f"cannot read {path}: {exc.strerror}") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) not in (n_in, n_in + 1):
            raise ModelCommandError(
                f"{path}, line {number}: expected {n_in} features (or {n_in + 1} columns "
                f"with a label), got {len(cells)} columns")
        try:
            rows.append([float(c) for c in cells[:n_in]])
        except ValueError:
            raise ModelCommandError(f"{path}, line {number}: a feature is not a number") from None
    if not rows:
        raise ModelCommandError(f"{path} has no rows")
    return np.array(rows)
