"""Client subcommands that use a saved model locally: evaluate, predict and export."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from thrift_trainer.training.data.letters import DataFormatError, load_letters
from thrift_trainer.training.models import mlp
from thrift_trainer.training.outputs.model_file import ModelFileError, load_model, without_optimizer
from thrift_trainer.training.outputs.torch_files import save_safetensors

LETTERS = string.ascii_uppercase


class ModelCommandError(Exception):
    """A model or data file the command cannot use; the message says which and why."""


def export(model_path: str, out: str | None = None) -> Path:
    """The model (or a checkpoint's model) of ``model_path`` as safetensors, which plain torch
    loads (training/outputs/torch_files.py); the description goes into its metadata."""
    weights, description = _load(model_path)
    target = Path(out) if out else Path(model_path).with_suffix(".safetensors")
    if target.resolve() == Path(model_path).resolve():
        raise ModelCommandError(f"--out {target} would overwrite the model it is made from")
    try:
        return save_safetensors(target, without_optimizer(weights),
                                {"model": str(description.get("model", "")),
                                 "description": description})
    except OSError as exc:
        raise ModelCommandError(f"cannot write {target}: {exc.strerror or exc}") from None


def _load(model_path: str) -> tuple[dict[str, np.ndarray], dict]:
    try:
        return load_model(model_path)
    except ModelFileError as exc:
        raise ModelCommandError(str(exc)) from None


def _load_mlp(model_path: str) -> tuple[dict[str, np.ndarray], mlp.MLPSpec]:
    weights, description = _load(model_path)
    if description.get("model") != "mlp":
        raise ModelCommandError(
            f"{model_path} holds a {description.get('model')!r} model; these commands "
            "score the letters MLP")
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


def evaluate(model_path: str, data_path: str) -> dict[str, float]:
    """Error rate and mean loss of the model on a labelled letters file."""
    weights, spec = _load_mlp(model_path)
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
    """Predicted letters for each row of a CSV of 16 features (a 17th label column is ignored)."""
    weights, spec = _load_mlp(model_path)
    features = _read_features(Path(data_path), spec.n_in)
    return [LETTERS[i] for i in mlp.predict(weights, features, spec)]


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
