"""DCGAN generators and discriminators, their JSON spec, and state <-> numpy for the wire.

Two architectures (DCGAN-28 was measured to learn recognisable digits in minutes on a CPU):

* ``dcgan28``: 28x28 greyscale (MNIST). With width w (32 by default) and z_dim 64:
  G: z -> Linear(2w*7*7) + BN + ReLU -> ConvT(2w->w, 4, 2, 1) + BN + ReLU
  -> ConvT(w->1, 4, 2, 1) + tanh (243k parameters);
  D: Conv(1->w, 4, 2, 1) + LReLU(0.2) -> Conv(w->2w, 4, 2, 1) + BN + LReLU(0.2)
  -> Linear(2w*7*7 -> 1) logits (37k parameters).
* ``dcgan64``: 64x64 RGB, the classic DCGAN of Radford et al. with width w (64 classic):
  G: z -> ConvT(z->8w, 4, 1, 0) 4x4 -> ConvT 8x8, 16x16, 32x32 halving the channels, each
  + BN + ReLU -> ConvT(w->3) 64x64 + tanh;
  D: the mirror, Conv(3->w) + LReLU, then three Conv + BN + LReLU doubling the channels,
  then Conv(8w->1, 4, 1, 0) logits.
* ``mlp28``: 28x28 greyscale, the MLP of the MD-GAN paper's MNIST experiments with hidden
  width w (512 there) and z_dim 100: G: z -> Linear(w) + BN + ReLU -> Linear(w) + BN +
  ReLU -> Linear(784) + tanh; D: Linear(784 -> w) + LReLU(0.2) -> Linear(w) + BN +
  LReLU(0.2) -> Linear(1) logits (the paper's ACGAN D has 11 outputs; ours is
  unconditional). Registered as ``mlpgan28`` (G 716,560 parameters without BN, as the
  paper counts; 718,608 with) and ``mlpgan28-tiny``.

Every G takes ``z`` of shape (n, z_dim) and returns images in [-1, 1]; every D returns
logits of shape (n,). ``batchnorm=False`` removes every BatchNorm module, which makes a
mean of per-unit gradients equal the full-batch gradient (tests of distributed against
single-process training need that). A convolution followed by BN has no bias in
``dcgan64`` (BN cancels it); ``dcgan28`` keeps its biases, as in the measured model.

The wire carries numpy arrays, so :func:`state_to_numpy` / :func:`numpy_to_state` move
parameters AND buffers (BN running statistics: averaging without them gives garbage
samples in eval mode) in ``state_dict`` order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from thrift_trainer.training.models.modules import copy_into, float32_copy

ARCHITECTURES = ("dcgan28", "dcgan64", "mlp28")
IMAGE_SHAPES = {"dcgan28": (1, 28, 28), "dcgan64": (3, 64, 64), "mlp28": (1, 28, 28)}
# Architectures whose images are 28x28 greyscale: they train on MNIST and are scored by
# the frozen MNIST classifier (training/outputs/gan_metrics.py).
MNIST_ARCHITECTURES = ("dcgan28", "mlp28")
LEAKY_SLOPE = 0.2
INIT_STD = 0.02


@dataclass(frozen=True)
class GanSpec:
    """Everything needed to rebuild a G and D pair, e.g. on a node from a JSON config."""

    arch: str
    z_dim: int
    width: int
    batchnorm: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or self.arch not in ARCHITECTURES:
            raise ValueError(f"GanSpec.arch must be one of {', '.join(ARCHITECTURES)}, "
                             f"got {self.arch!r}")
        for name in ("z_dim", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GanSpec.{name} must be a positive int, got {value!r}")
        if not isinstance(self.batchnorm, bool):
            raise ValueError(f"GanSpec.batchnorm must be bool, got {self.batchnorm!r}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of the images G makes and D reads."""
        return IMAGE_SHAPES[self.arch]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` rebuilds an equal spec from it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GanSpec:
        """Rebuild a spec, rejecting unknown or missing keys by name (a typo in a config
        must not silently fall back to a default)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                raise ValueError(f"unknown GanSpec key {key!r}; known: {', '.join(fields)}")
        for name, field in fields.items():
            if name not in data and field.default is dataclasses.MISSING:
                raise ValueError(f"GanSpec key {name!r} is missing")
        return cls(**data)


GAN_MODELS: dict[str, GanSpec] = {
    "dcgan28": GanSpec("dcgan28", z_dim=64, width=32),
    # Twice the channels (G 553k + D 139k parameters, about 3x the maths): a standalone
    # run at global batch 96 scored FID 53 after 5,000 updates where dcgan28 scored 96.
    "dcgan28-wide": GanSpec("dcgan28", z_dim=64, width=64),
    "dcgan28-tiny": GanSpec("dcgan28", z_dim=8, width=4),
    "dcgan64": GanSpec("dcgan64", z_dim=100, width=64),
    "dcgan64-tiny": GanSpec("dcgan64", z_dim=8, width=4),
    # The MD-GAN paper's MNIST MLP (z_dim 100, hidden 512): 716,560 G parameters without
    # BatchNorm, as the paper counts; its D ends in 1 logit instead of ACGAN's 11.
    "mlpgan28": GanSpec("mlp28", z_dim=100, width=512),
    "mlpgan28-tiny": GanSpec("mlp28", z_dim=8, width=16),
}


def is_mnist_model(name: str) -> bool:
    """True for the registered models that make 28x28 greyscale images (MNIST)."""
    return name in GAN_MODELS and GAN_MODELS[name].arch in MNIST_ARCHITECTURES


def gan_spec(name: str, batchnorm: bool = True) -> GanSpec:
    """The registered spec called ``name``, with or without BatchNorm."""
    if name not in GAN_MODELS:
        raise ValueError(f"unknown GAN model {name!r}; known: {', '.join(GAN_MODELS)}")
    return dataclasses.replace(GAN_MODELS[name], batchnorm=batchnorm)


def _block(layer: nn.Module, channels: int, batchnorm: bool, dims: int,
           activation: nn.Module) -> list[nn.Module]:
    """layer [+ BatchNorm] + activation."""
    norm: list[nn.Module] = []
    if batchnorm:
        norm = [nn.BatchNorm1d(channels) if dims == 1 else nn.BatchNorm2d(channels)]
    return [layer, *norm, activation]


class Generator28(nn.Module):
    """DCGAN-28 generator: (n, z_dim) -> (n, 1, 28, 28) in [-1, 1]."""

    def __init__(self, z_dim: int, width: int, batchnorm: bool) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.width = width
        wide = 2 * width
        self.project = nn.Sequential(
            *_block(nn.Linear(z_dim, wide * 7 * 7), wide * 7 * 7, batchnorm, 1, nn.ReLU()))
        self.upsample = nn.Sequential(
            *_block(nn.ConvTranspose2d(wide, width, 4, 2, 1), width, batchnorm, 2, nn.ReLU()),
            nn.ConvTranspose2d(width, 1, 4, 2, 1),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.upsample(self.project(z).view(-1, 2 * self.width, 7, 7))


class Discriminator28(nn.Module):
    """DCGAN-28 discriminator: (n, 1, 28, 28) -> logits (n,)."""

    def __init__(self, width: int, batchnorm: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 4, 2, 1),
            nn.LeakyReLU(LEAKY_SLOPE),
            *_block(nn.Conv2d(width, 2 * width, 4, 2, 1), 2 * width, batchnorm, 2,
                    nn.LeakyReLU(LEAKY_SLOPE)),
            nn.Flatten(),
            nn.Linear(2 * width * 7 * 7, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


class GeneratorMlp28(nn.Module):
    """The MD-GAN paper's MLP generator: z -> Linear(w) [+ BN] + ReLU -> Linear(w) [+ BN]
    + ReLU -> Linear(784) + tanh, viewed as (n, 1, 28, 28)."""

    def __init__(self, z_dim: int, width: int, batchnorm: bool) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.net = nn.Sequential(
            *_block(nn.Linear(z_dim, width), width, batchnorm, 1, nn.ReLU()),
            *_block(nn.Linear(width, width), width, batchnorm, 1, nn.ReLU()),
            nn.Linear(width, 28 * 28),
            nn.Tanh(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).view(-1, 1, 28, 28)


class DiscriminatorMlp28(nn.Module):
    """The MD-GAN paper's MLP discriminator with one logit: Linear(784 -> w) + LReLU(0.2)
    -> Linear(w) [+ BN] + LReLU(0.2) -> Linear(1). Like DCGAN-28's D, only its second
    layer has BatchNorm."""

    def __init__(self, width: int, batchnorm: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, width),
            nn.LeakyReLU(LEAKY_SLOPE),
            *_block(nn.Linear(width, width), width, batchnorm, 1, nn.LeakyReLU(LEAKY_SLOPE)),
            nn.Linear(width, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


class Generator64(nn.Module):
    """Classic DCGAN generator: (n, z_dim) -> (n, 3, 64, 64) in [-1, 1]."""

    def __init__(self, z_dim: int, width: int, batchnorm: bool) -> None:
        super().__init__()
        self.z_dim = z_dim
        channels = [z_dim, 8 * width, 4 * width, 2 * width, width]
        layers: list[nn.Module] = []
        for index, (c_in, c_out) in enumerate(zip(channels, channels[1:], strict=False)):
            stride, padding = (1, 0) if index == 0 else (2, 1)
            conv = nn.ConvTranspose2d(c_in, c_out, 4, stride, padding, bias=not batchnorm)
            layers += _block(conv, c_out, batchnorm, 2, nn.ReLU())
        self.net = nn.Sequential(*layers, nn.ConvTranspose2d(width, 3, 4, 2, 1), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.view(-1, self.z_dim, 1, 1))


class Discriminator64(nn.Module):
    """Classic DCGAN discriminator: (n, 3, 64, 64) -> logits (n,)."""

    def __init__(self, width: int, batchnorm: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(LEAKY_SLOPE)]
        for c_in in (width, 2 * width, 4 * width):
            conv = nn.Conv2d(c_in, 2 * c_in, 4, 2, 1, bias=not batchnorm)
            layers += _block(conv, 2 * c_in, batchnorm, 2, nn.LeakyReLU(LEAKY_SLOPE))
        self.net = nn.Sequential(*layers, nn.Conv2d(8 * width, 1, 4, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).view(-1)


def init_dcgan_weights(module: nn.Module, generator: torch.Generator) -> None:
    """DCGAN initialisation: conv/linear weights N(0, 0.02), BN weights N(1, 0.02), all
    biases 0. Drawn from ``generator`` so that a seed fixes the model on every machine."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            nn.init.normal_(layer.weight, 0.0, INIT_STD, generator=generator)
        elif isinstance(layer, nn.modules.batchnorm._BatchNorm):
            nn.init.normal_(layer.weight, 1.0, INIT_STD, generator=generator)
        else:
            continue
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


def build_gan(spec: GanSpec, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A freshly initialised (G, D) pair, identical for the same spec and seed.

    The global torch RNG is left untouched (module constructors draw from it before our
    init overwrites the weights), so building a model cannot shift other random streams.
    """
    with torch.random.fork_rng(devices=[]):
        if spec.arch == "dcgan28":
            g: nn.Module = Generator28(spec.z_dim, spec.width, spec.batchnorm)
            d: nn.Module = Discriminator28(spec.width, spec.batchnorm)
        elif spec.arch == "mlp28":
            g = GeneratorMlp28(spec.z_dim, spec.width, spec.batchnorm)
            d = DiscriminatorMlp28(spec.width, spec.batchnorm)
        else:
            g = Generator64(spec.z_dim, spec.width, spec.batchnorm)
            d = Discriminator64(spec.width, spec.batchnorm)
    rng = torch.Generator().manual_seed(seed)
    init_dcgan_weights(g, rng)
    init_dcgan_weights(d, rng)
    return g, d


@torch.no_grad()
def sample_images(g: nn.Module, n: int, seed: int = 0, batch_size: int = 500) -> torch.Tensor:
    """``n`` images from G in eval mode (BN running statistics), for evaluation.

    All of z is drawn first, so the images depend on the seed and not on the batch size.
    The mode is restored afterwards: leaving G in eval mode would silently change training.
    """
    z = torch.randn(n, g.z_dim, generator=torch.Generator().manual_seed(seed))
    was_training = g.training
    g.eval()
    try:
        return torch.cat([g(z[start:start + batch_size]) for start in range(0, n, batch_size)])
    finally:
        g.train(was_training)


def state_to_numpy(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """Parameters and buffers as float32 C-contiguous copies, in ``state_dict`` order.

    Integer buffers (BN's ``num_batches_tracked``) become float32 too, so that every array
    can be averaged like the others; counts below 2**24 survive exactly. ``prefix`` is
    put before every name, so G and D can share one dict (e.g. ``"G."``, ``"D."``).
    """
    return {prefix + name: float32_copy(value) for name, value in module.state_dict().items()}


def numpy_to_state(module: nn.Module, arrays: Mapping[str, np.ndarray], prefix: str = "") -> None:
    """Copy arrays into the module's parameters and buffers in place (an optimizer holding
    the parameters keeps working). Names under ``prefix`` must match the state exactly;
    everything is checked before anything is copied, so a bad dict changes nothing."""
    state = module.state_dict()
    given = _matching_arrays(state, arrays, prefix)
    for name, target in state.items():
        value = given[name] if target.is_floating_point() else np.rint(given[name])
        copy_into(target, value)


def gradients_to_numpy(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """Parameter gradients as float32 arrays in parameter order (zeros where a parameter got
    no gradient, so every node sends the same set of names)."""
    return {prefix + name: np.zeros(tuple(p.shape), np.float32) if p.grad is None
            else float32_copy(p.grad) for name, p in module.named_parameters()}


def numpy_to_gradients(module: nn.Module, arrays: Mapping[str, np.ndarray],
                       prefix: str = "") -> None:
    """Set every parameter's ``.grad`` from arrays (e.g. averaged gradients) before an
    optimizer step; names under ``prefix`` must match the parameters exactly. A float32
    CPU gradient already there is written over (the same bits as a fresh one: numpy's
    rounding to float32 either way), so a step allocates nothing."""
    params = dict(module.named_parameters())
    given = _matching_arrays(params, arrays, prefix)
    for name, p in params.items():
        if _reusable_grad(p):
            copy_into(p.grad, given[name])  # type: ignore[arg-type]
        else:
            p.grad = torch.from_numpy(np.array(given[name], dtype=np.float32,
                                               copy=True)).to(p.dtype)


def _reusable_grad(p: nn.Parameter) -> bool:
    grad = p.grad
    return grad is not None and p.dtype == torch.float32 and grad.dtype == torch.float32 \
        and grad.device.type == "cpu" and grad.shape == p.shape and grad.is_contiguous()


def _matching_arrays(targets: Mapping[str, torch.Tensor], arrays: Mapping[str, np.ndarray],
                     prefix: str) -> dict[str, np.ndarray]:
    """The arrays under ``prefix``, keyed without it, after checking that their names and
    shapes are exactly those of ``targets``: a partial or misshapen update is a bug."""
    given = {name[len(prefix):]: np.asarray(value) for name, value in arrays.items()
             if name.startswith(prefix)}
    missing = [prefix + name for name in targets if name not in given]
    unexpected = [prefix + name for name in given if name not in targets]
    if missing or unexpected:
        parts = [f"{label} {', '.join(names[:3])}"
                 for label, names in (("missing", missing), ("unexpected", unexpected)) if names]
        raise ValueError(f"arrays do not match the model: {'; '.join(parts)}")
    for name, target in targets.items():
        if given[name].shape != tuple(target.shape):
            raise ValueError(f"{prefix}{name}: shape {given[name].shape} does not match the "
                             f"model's {tuple(target.shape)}")
    return given
