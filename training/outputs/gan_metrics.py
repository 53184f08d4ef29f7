"""Offline GAN scores for MNIST: Inception Score and FID from a small frozen classifier.

The usual FID/IS tools download Inception weights at run time, which the project cannot
rely on. Instead a small MNIST classifier (2 conv + FC64 + FC10, 114k parameters) was
trained once on the training part by ``scripts/train_mnist_classifier.py`` and ships as
``data/mnist/classifier.npz`` (plain arrays, no pickle; it is never downloaded).

* Inception Score: ``exp(E_x KL(p(y|x) || p(y)))`` from the classifier's logits (one split).
* FID: the Frechet distance between Gaussians fitted to the 64-d penultimate features
  (``fid_features``) and to the 10 logits (``fid_logits``, what the MD-GAN paper reports
  via TF-GAN's MNIST classifier), against the held-out real images.

Numbers are comparable only with the same classifier file, the same ``n`` and the same
held-out reference; the real-vs-real floor of FID falls with ``n`` (about 10 at n=500,
1.8 at n=2,000), hence the default n = 2,000.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from thrift_trainer.training.data import mnist
from thrift_trainer.training.outputs.checked_npz import read_npz

DEFAULT_CLASSIFIER = mnist.DEFAULT_MNIST_DIR / "classifier.npz"
DEFAULT_N = 2_000
SCORE_SEED = 12345  # noise of every scored sample, so scores differ only by the model
_META_KEY = "__meta__"


class MnistClassifier(nn.Module):
    """2 conv (5x5, 16 and 32 channels, each + ReLU + 2x2 max-pool) + FC64 + FC10.

    Input: (n, 1, 28, 28) in [-1, 1], the range of the GAN images, so that no rescaling
    step can be forgotten between generator and scorer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(),
        )
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def features_and_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The 64-d post-ReLU features (for FID) and the logits (for IS and FID_logits)."""
        features = self.features(x)
        return features, self.head(features)


def save_classifier(model: MnistClassifier, path: str | os.PathLike,
                    meta: dict[str, object]) -> None:
    """Write the weights as float32 arrays plus a JSON string of metadata (no pickle)."""
    arrays = {name: value.detach().numpy().astype(np.float32)
              for name, value in model.state_dict().items()}
    arrays[_META_KEY] = np.array(json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_classifier(path: str | os.PathLike = DEFAULT_CLASSIFIER) -> MnistClassifier:
    """The frozen classifier (eval mode, no gradients); cached per file."""
    return _load_classifier_cached(str(Path(path).resolve()))


@functools.lru_cache(maxsize=2)
def _load_classifier_cached(path: str) -> MnistClassifier:
    try:
        arrays = read_npz(path, path, keep=lambda name: name != _META_KEY)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"classifier {path} not found; it ships with the repository "
            "(recreate it with scripts/train_mnist_classifier.py)") from None
    model = MnistClassifier()
    state = {name: torch.from_numpy(value) for name, value in arrays.items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    model.requires_grad_(False)
    return model


def classifier_meta(path: str | os.PathLike = DEFAULT_CLASSIFIER) -> dict[str, object]:
    """How the shipped classifier was trained (seed, epochs, held-out accuracy, ...)."""
    return json.loads(str(read_npz(path, str(path), keep=lambda name: name == _META_KEY)
                          [_META_KEY]))


@torch.no_grad()
def classifier_outputs(images: torch.Tensor, classifier: MnistClassifier | None = None,
                       batch_size: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Features (n, 64) and logits (n, 10) as float64 numpy, computed in batches."""
    _check_images(images)
    model = classifier or load_classifier()
    features, logits = [], []
    for start in range(0, len(images), batch_size):
        f, lg = model.features_and_logits(images[start:start + batch_size].float())
        features.append(f.numpy())
        logits.append(lg.numpy())
    return np.concatenate(features).astype(np.float64), np.concatenate(logits).astype(np.float64)


def _check_images(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1:] != (1, 28, 28):
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images)
        raise ValueError(f"expected a tensor of MNIST images (n, 1, 28, 28) in [-1, 1], "
                         f"got {shape}")


def inception_score(logits: np.ndarray) -> float:
    """exp(mean KL(p(y|x) || p(y))): high when each image is confidently one class and the
    classes are balanced; 1 for noise, at most 10 for MNIST."""
    log_p = logits - _logsumexp(logits)
    p = np.exp(log_p)
    log_marginal = np.log(p.mean(axis=0))
    return float(np.exp(np.mean(np.sum(p * (log_p - log_marginal), axis=1))))


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=1, keepdims=True)
    return top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class Gaussian:
    """Mean and covariance of a set of feature vectors (float64)."""

    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Gaussian:
        """Sample mean and unbiased covariance of rows of ``x`` (at least 2 rows)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or len(x) < 2:
            raise ValueError(f"need at least 2 feature vectors (n, d), got shape {x.shape}")
        return cls(x.mean(axis=0), np.cov(x, rowvar=False))


def frechet_distance(a: Gaussian, b: Gaussian) -> float:
    """||mu_a - mu_b||^2 + tr(C_a) + tr(C_b) - 2 tr((C_a C_b)^(1/2)).

    C_a C_b is not symmetric, but it is similar to S C_b S with S = C_a^(1/2) (symmetric
    PSD), whose eigenvalues are those of C_a C_b; so tr((C_a C_b)^(1/2)) is the sum of the
    square roots of the eigenvalues of S C_b S, found with symmetric eigen-decompositions
    only (stable, no scipy, no complex parts to discard).
    """
    sqrt_a = _sqrt_psd(a.cov)
    middle = sqrt_a @ b.cov @ sqrt_a
    eigenvalues = np.linalg.eigvalsh((middle + middle.T) / 2)
    trace_sqrt = np.sqrt(np.clip(eigenvalues, 0.0, None)).sum()
    diff = a.mean - b.mean
    return float(diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2.0 * trace_sqrt)


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    """The symmetric square root of a symmetric PSD matrix (tiny negative eigenvalues from
    rounding are clipped to 0)."""
    eigenvalues, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * np.sqrt(np.clip(eigenvalues, 0.0, None))) @ vectors.T


@dataclass(frozen=True)
class ReferenceStats:
    """Gaussians of the held-out real images' features and logits, for FID."""

    features: Gaussian
    logits: Gaussian
    n: int


def reference_stats(n: int = DEFAULT_N,
                    root: str | os.PathLike = mnist.DEFAULT_MNIST_DIR) -> ReferenceStats:
    """Statistics of the first ``n`` held-out images; computed on first use, then cached."""
    return _reference_cached(n, str(Path(root).resolve()))


@functools.lru_cache(maxsize=4)
def _reference_cached(n: int, root: str) -> ReferenceStats:
    images, _ = mnist.held_out_part(root)
    if not 2 <= n <= len(images):
        raise ValueError(f"n must be in 2..{len(images)} (the held-out part), got {n}")
    features, logits = classifier_outputs(mnist.to_model_input(images[:n]))
    return ReferenceStats(Gaussian.fit(features), Gaussian.fit(logits), n)


@dataclass(frozen=True)
class GanScores:
    """IS, FID on features and FID on logits of n images against the held-out reference."""

    inception_score: float
    fid_features: float
    fid_logits: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready, e.g. for a run's metrics.jsonl."""
        return {"inception_score": self.inception_score, "fid_features": self.fid_features,
                "fid_logits": self.fid_logits, "n": self.n}


def score_images(images: torch.Tensor, n: int = DEFAULT_N,
                 root: str | os.PathLike = mnist.DEFAULT_MNIST_DIR) -> GanScores:
    """Score the first ``n`` images (n, 1, 28, 28) in [-1, 1] against ``n`` held-out images.

    Fewer than ``n`` images is an error rather than a smaller sample, because FID depends
    on n and numbers at different n must never be compared by accident.
    """
    _check_images(images)
    if len(images) < n:
        raise ValueError(f"need at least n={n} images to score, got {len(images)}")
    reference = reference_stats(n, root)
    features, logits = classifier_outputs(images[:n])
    return GanScores(
        inception_score=inception_score(logits),
        fid_features=frechet_distance(Gaussian.fit(features), reference.features),
        fid_logits=frechet_distance(Gaussian.fit(logits), reference.logits),
        n=n,
    )
