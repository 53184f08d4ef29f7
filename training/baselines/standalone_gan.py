"""The standalone GAN baseline: the usual alternating DCGAN training in one process.

The same models, losses and Adam settings as FL-GAN and MD-GAN (training/gan_training.py),
on the whole MNIST training part, with batch b or N x b: the MD-GAN paper compares both
against the distributed methods (b is what one worker sees per iteration, N x b what all
of them see together). Every iteration is a D step on (b real, b generated) and then a G
step against the updated D on the same fakes. `scripts/standalone_gan.py` is its command
line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from thrift_trainer.training.data import mnist
from thrift_trainer.training.gan_training import (
    alternating_step,
    batch_indices,
    noise,
    real_batch,
    training_size,
)
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.outputs import gan_metrics


def train_standalone_gan(model: str, batch_size: int, iterations: int,
                         dataset_dir: Path = mnist.DEFAULT_MNIST_DIR, seed: int = 1,
                         lr: float = 2e-4, betas: tuple[float, float] = (0.5, 0.999),
                         batchnorm: bool = True,
                         on_iteration: Callable[[int, nn.Module], None] | None = None
                         ) -> tuple[nn.Module, nn.Module]:
    """Train (G, D) for ``iterations`` alternating steps of ``batch_size``; returns them."""
    spec = gan_models.gan_spec(model, batchnorm)
    g, d = gan_models.build_gan(spec, seed=seed)
    opt_g = torch.optim.Adam(g.parameters(), lr=lr, betas=betas)
    opt_d = torch.optim.Adam(d.parameters(), lr=lr, betas=betas)
    everything = np.arange(training_size(dataset_dir))  # one shard: the whole training part
    for step in range(iterations):
        real = real_batch(dataset_dir, batch_indices(everything, batch_size, step, seed, 0))
        alternating_step(g, d, opt_g, opt_d, real, noise(spec.z_dim, batch_size, seed, step))
        if on_iteration is not None:
            on_iteration(step + 1, g)
    return g, d


def score(g: nn.Module, n: int, dataset_dir: Path = mnist.DEFAULT_MNIST_DIR) -> dict[str, float]:
    """IS and FID of ``n`` images from fixed noise, as the algorithms' ``score`` does."""
    images = gan_models.sample_images(g, n, seed=gan_metrics.SCORE_SEED)
    return gan_metrics.score_images(images, n, root=dataset_dir).to_dict()
