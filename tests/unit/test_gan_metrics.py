"""Offline FID/IS: the maths against slow references, and the sanity ordering on MNIST."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thrift_trainer.training.data import mnist
from thrift_trainer.training.outputs import gan_metrics
from thrift_trainer.training.outputs.gan_metrics import (
    Gaussian,
    frechet_distance,
    inception_score,
    score_images,
)

torch.set_num_threads(1)

N = 500  # small for speed; the ordering below holds with wide margins at this n


def random_gaussian(rng: np.random.Generator, dim: int) -> Gaussian:
    factor = rng.normal(size=(dim, dim))
    return Gaussian(rng.normal(size=dim), factor @ factor.T / dim + 0.1 * np.eye(dim))


def denman_beavers_sqrt(matrix: np.ndarray, steps: int = 60) -> np.ndarray:
    """Square root of a matrix with positive eigenvalues, by a plain iteration that shares
    nothing with the eigen-decomposition route of the code under test."""
    y, z = matrix.copy(), np.eye(len(matrix))
    for _ in range(steps):
        y, z = (y + np.linalg.inv(z)) / 2, (z + np.linalg.inv(y)) / 2
    return y


def slow_frechet(a: Gaussian, b: Gaussian) -> float:
    root = denman_beavers_sqrt(a.cov @ b.cov)
    assert np.allclose(root @ root, a.cov @ b.cov)
    diff = a.mean - b.mean
    return float(diff @ diff + np.trace(a.cov + b.cov - 2 * root))


@pytest.mark.parametrize("dim", [2, 10, 64])
def test_frechet_distance_matches_a_slow_reference(dim):
    rng = np.random.default_rng(dim)
    a, b = random_gaussian(rng, dim), random_gaussian(rng, dim)
    assert frechet_distance(a, b) == pytest.approx(slow_frechet(a, b), rel=1e-9)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-9)


def test_frechet_distance_of_diagonal_gaussians_has_a_closed_form():
    a = Gaussian(np.array([0.0, 1.0, 2.0]), np.diag([1.0, 4.0, 9.0]))
    b = Gaussian(np.array([1.0, 1.0, 0.0]), np.diag([4.0, 4.0, 1.0]))
    assert frechet_distance(a, b) == pytest.approx(1 + 4 + (1 + 0 + 4))


def test_fid_of_a_set_with_itself_is_zero():
    images, _ = mnist.training_part()
    features, logits = gan_metrics.classifier_outputs(mnist.to_model_input(images[:N]))
    for values in (features, logits):
        stats = Gaussian.fit(values)
        assert abs(frechet_distance(stats, stats)) < 1e-6 * np.trace(stats.cov)


def test_inception_score_bounds():
    assert inception_score(np.zeros((50, 10))) == pytest.approx(1.0)
    confident = np.full((100, 10), -50.0)
    confident[np.arange(100), np.arange(100) % 10] = 50.0
    assert inception_score(confident) == pytest.approx(10.0, rel=1e-6)
    assert inception_score(confident[np.arange(100) % 10 < 5]) == pytest.approx(5.0, rel=1e-6)


def test_shipped_classifier_is_frozen_and_accurate():
    model = gan_metrics.load_classifier()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # conv 5x5 1 -> 16, conv 5x5 16 -> 32, FC 32*7*7 -> 64, FC 64 -> 10, with biases
    layers = [(1 * 25, 16), (16 * 25, 32), (32 * 7 * 7, 64), (64, 10)]
    assert sum(p.numel() for p in model.parameters()) == sum(
        n_in * n_out + n_out for n_in, n_out in layers) == 114_314
    images, labels = mnist.held_out_part()
    _, logits = gan_metrics.classifier_outputs(mnist.to_model_input(images))
    assert np.mean(logits.argmax(axis=1) == labels) >= 0.95
    assert gan_metrics.classifier_meta()["held_out_accuracy"] >= 0.95


def test_sanity_ordering():
    """real < real + N(0, 0.25^2) < digits 0-4 only < uniform noise in FID; IS reversed."""
    images, labels = mnist.training_part()
    rng = torch.Generator().manual_seed(0)
    real = mnist.to_model_input(images[:N])
    noisy = (real + 0.25 * torch.randn(real.shape, generator=rng)).clamp(-1, 1)
    low_digits = mnist.to_model_input(images[labels < 5][:N])
    uniform = torch.rand(real.shape, generator=rng) * 2 - 1
    scores = [score_images(x, N) for x in (real, noisy, low_digits, uniform)]
    for key in ("fid_features", "fid_logits"):
        values = [getattr(s, key) for s in scores]
        assert values == sorted(values) and values[0] > 0, (key, values)
    values = [s.inception_score for s in scores]
    assert values == sorted(values, reverse=True), values
    # IS is at most the number of classes the images spread over: about 10 for real
    # digits a 95 % accurate classifier recognises (9.4 measured), about 5 for five digits
    # (5.1: the few misread ones spread it a little), and about 1 for noise, which the
    # classifier puts in the same class whatever the image (1.004)
    assert values[0] > 8.5 and 4.0 < values[2] < 6.0 and values[3] < 1.5
    assert scores[0].to_dict()["n"] == N


def test_score_images_refuses_too_few_or_wrong_images():
    with pytest.raises(ValueError, match="need at least n=500 images"):
        score_images(torch.zeros(10, 1, 28, 28), N)
    with pytest.raises(ValueError, match=r"\(n, 1, 28, 28\)"):
        score_images(torch.zeros(N, 3, 28, 28), N)
    with pytest.raises(ValueError, match="n must be in 2..2000"):
        gan_metrics.reference_stats(2_001)
