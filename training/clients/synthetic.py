"""FedProx's Synthetic(alpha, beta) data (Li et al. 2020, "Federated optimization in
heterogeneous networks", arXiv 1812.06127, section 5.1): devices that each label their
own data with their own multinomial logistic regression model.

For device k: u_k ~ N(0, alpha), B_k ~ N(0, beta); its model W_k ~ N(u_k, 1) (features x
classes) and b_k ~ N(u_k, 1); its inputs x ~ N(v_k, Sigma) with v_k ~ N(B_k, 1) per feature
and Sigma diagonal, Sigma_jj = j^-1.2; its labels y = argmax softmax(W_k x + b_k), the
argmax of the logits. alpha sets how much the devices' models differ, beta how much their
inputs do. Sizes follow a power law as in the authors' generator: lognormal(4, 2) + 50.
Where the paper writes N(0, alpha) its generator passes alpha as the standard deviation
(numpy's scale); so does this one (the two readings agree at alpha, beta in {0, 1}).

Every device draws from its own generator, spawned from ``seed``: device k's data is the
same whatever the number of devices.
"""

from __future__ import annotations

import math

import numpy as np

from thrift_trainer.training.clients.errors import ClientsError

DEVICES = 30  # the paper's network
FEATURES = 60
CLASSES = 10
SIZE_MEAN, SIZE_SIGMA, SIZE_MIN = 4.0, 2.0, 50  # sizes: int(lognormal(4, 2)) + 50

Device = tuple[np.ndarray, np.ndarray]  # (X: float32 (n, features), y: int64 (n,))


def synthetic(alpha: float, beta: float, seed: int, devices: int = DEVICES,
              features: int = FEATURES, classes: int = CLASSES) -> list[Device]:
    """Synthetic(alpha, beta): per device its inputs X and labels y."""
    _check(alpha, beta, devices, features, classes)
    sizes_seed, *device_seeds = np.random.SeedSequence(seed).spawn(devices + 1)
    sizes = device_sizes(np.random.Generator(np.random.PCG64(sizes_seed)), devices)
    return [_device(np.random.Generator(np.random.PCG64(device_seed)), int(size), alpha,
                    beta, features, classes)
            for device_seed, size in zip(device_seeds, sizes, strict=True)]


def device_sizes(rng: np.random.Generator, devices: int) -> np.ndarray:
    """Power-law sizes, as the authors' generator draws them."""
    return rng.lognormal(SIZE_MEAN, SIZE_SIGMA, devices).astype(np.int64) + SIZE_MIN


def _device(rng: np.random.Generator, size: int, alpha: float, beta: float, features: int,
            classes: int) -> Device:
    model_mean = rng.normal(0.0, alpha)  # u_k
    input_mean = rng.normal(0.0, beta)  # B_k
    weights = rng.normal(model_mean, 1.0, (features, classes))
    bias = rng.normal(model_mean, 1.0, classes)
    centre = rng.normal(input_mean, 1.0, features)  # v_k
    spread = np.arange(1, features + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    inputs = (centre + rng.standard_normal((size, features)) * spread).astype(np.float32)
    # softmax is monotone: its argmax is the logits' argmax
    labels = np.argmax(inputs.astype(np.float64) @ weights + bias, axis=1).astype(np.int64)
    return inputs, labels


def _check(alpha: float, beta: float, devices: int, features: int, classes: int) -> None:
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or value < 0:
            raise ClientsError(f"synthetic: {name} must be a finite number >= 0, got "
                               f"{value!r}")
    for name, value, minimum in (("devices", devices, 1), ("features", features, 1),
                                 ("classes", classes, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ClientsError(f"synthetic: {name} must be an integer >= {minimum}, got "
                               f"{value!r}")
