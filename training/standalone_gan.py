"""The standalone GAN baseline: the usual alternating DCGAN training in one process.

The same models, losses and Adam settings as FL-GAN and MD-GAN (training/gan_training.py),
on the whole MNIST training part, with batch b or N x b: the MD-GAN paper compares both
against the distributed methods (b is what one worker sees per iteration, N x b what all
of them see together). Every iteration is a D step on (b real, b generated) and then a G
step against the updated D on the same fakes.

    python -m training.standalone_gan --model dcgan28-tiny --batch-size 64 --workers 4 \\
        --iterations 300      # trains with b = 64 and with 4 x 64, prints IS and FID
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training import gan_metrics, gan_models, mnist
from training.gan_training import (
    alternating_step,
    batch_indices,
    noise,
    real_batch,
    training_size,
)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dcgan28", help="a 28x28 GAN model (default dcgan28)")
    parser.add_argument("--batch-size", type=int, default=64, help="b (default 64)")
    parser.add_argument("--workers", type=int, default=4, help="N: also train with N x b")
    parser.add_argument("--iterations", type=int, default=1000, help="D+G steps (default 1000)")
    parser.add_argument("--eval-n", type=int, default=1000, help="images scored (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for batch in sorted({args.batch_size, args.workers * args.batch_size}):
        g, _ = train_standalone_gan(args.model, batch, args.iterations, seed=args.seed)
        scores = score(g, args.eval_n)
        print(f"batch {batch}: IS {scores['inception_score']:.2f}, FID features "
              f"{scores['fid_features']:.1f}, FID logits {scores['fid_logits']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
