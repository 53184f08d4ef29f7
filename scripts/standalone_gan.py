"""The standalone GAN baseline: the usual alternating DCGAN training in one process.

    python scripts/standalone_gan.py --model dcgan28-tiny --batch-size 64 --workers 4 \\
        --iterations 300      # trains with b = 64 and with 4 x 64, prints IS and FID

The maths are training/baselines/standalone_gan.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from thrift_trainer.training.baselines.standalone_gan import score, train_standalone_gan  # noqa: E402


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
