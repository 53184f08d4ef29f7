"""The GANs under sync_sgd: a node's mean gradients of G and D over its unit, and the
coordinator's (G, D) with one Adam each.

GAN maths. D's and G's gradients are both computed from the SAME received (G, D) version:
this is simultaneous gradient descent, not the usual alternating update (D step, then G step
against the new D). D minimises BCE(D(x), 1) + BCE(D(G(z)), 0), G minimises the
non-saturating BCE(D(G(z)), 1), all with logits. The noise z of a unit is drawn from a seed
derived from (seed, round, unit_id), so any node (and a single-process reference) produces the
same fakes for the same unit.

BatchNorm. Gradients alone never move the coordinator's BN running statistics, and its
models are only evaluated, never run in training mode; so a node returns the running
statistics its modules hold after its pass over the unit, and the engine averages them
(weighted by sample counts) like the gradients; ``apply`` installs the average. With BN, the
average of per-unit gradients is not the full-batch gradient (batch statistics are per
micro-batch): that is inherent to data-parallel BN, not a bug.

Names on the wire: weights ``G.<state_dict name>`` / ``D.<state_dict name>`` (parameters
and buffers, float32); a node's update ``grad.<weight name>`` for every parameter and
``buffer.<weight name>`` for every buffer (e.g. ``grad.D.net.0.weight``,
``buffer.G.project.1.running_mean``).

Per-round evaluation stays cheap: D's error rate and BCE loss on a fixed probe of 64 real
images (MNIST: the first held-out ones; an image folder: its first images) and 64 fakes
from fixed noise, both models in eval mode. An error near 0.5 means D cannot tell G's
images from real ones; it is a progress proxy, not a quality metric (FID).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from thrift_trainer.training.algorithms.config_checks import ConfigError
from thrift_trainer.training.cancel import no_step
from thrift_trainer.training.gan_training import PROBE_SEED
from thrift_trainer.training.models import gan_models
from thrift_trainer.training.models.modules import copy_into, float32_copy
from thrift_trainer.training.models.names import BUFFER, GRAD
from thrift_trainer.training.models.pool import ModulePool
from thrift_trainer.training.units import RoundEval, UnitJob, UnitOutput, Weights, unit_seed
from thrift_trainer.training.update_checks import check_combined_names


def unit_noise(z_dim: int, n: int, seed: int, round_index: int, unit_id: str) -> torch.Tensor:
    """The noise (n, z_dim) behind a unit's fakes; drawn at once so that the micro-batch size
    cannot change it."""
    generator = torch.Generator().manual_seed(unit_seed(seed, round_index, unit_id))
    return torch.randn(n, z_dim, generator=generator)


def gan_losses(g: nn.Module, d: nn.Module, real: torch.Tensor,
               z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(D loss, G loss, D's misclassified count) on one batch, both from the same (G, D):
    D's loss treats the fakes as data (only D's parameters are differentiated for it)."""
    fake = g(z)
    real_logits, fake_logits = d(real), d(fake)
    d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
              + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))
    g_loss = F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))
    wrong = (real_logits <= 0).sum() + (fake_logits > 0).sum()
    return d_loss, g_loss, wrong


def gan_unit_update(g: nn.Module, d: nn.Module, real: torch.Tensor, z: torch.Tensor,
                    batch_size: int, step: Callable[[], None] = no_step
                    ) -> tuple[Weights, float, float]:
    """Mean gradients over the unit (micro-batches weighted by their share) and the modules'
    buffers after the pass; also the mean D loss and D's error rate on reals and fakes.
    ``step`` is called before every micro-batch (a node's cancel check)."""
    g.train()
    d.train()
    g_params, d_params = list(g.parameters()), list(d.parameters())
    g_sum = [torch.zeros_like(p) for p in g_params]
    d_sum = [torch.zeros_like(p) for p in d_params]
    n, loss, wrong = len(real), 0.0, 0
    for start in range(0, n, batch_size):
        step()
        share = len(real[start:start + batch_size]) / n
        d_loss, g_loss, batch_wrong = gan_losses(g, d, real[start:start + batch_size],
                                                 z[start:start + batch_size])
        for total, grad in zip(d_sum, torch.autograd.grad(d_loss * share, d_params,
                                                          retain_graph=True), strict=True):
            total += grad
        for total, grad in zip(g_sum, torch.autograd.grad(g_loss * share, g_params),
                               strict=True):
            total += grad
        loss += float(d_loss.detach()) * share
        wrong += int(batch_wrong)
    update = {**_named(GRAD + "G.", g.named_parameters(), g_sum),
              **_named(GRAD + "D.", d.named_parameters(), d_sum),
              **_buffers(g, BUFFER + "G."), **_buffers(d, BUFFER + "D.")}
    return update, loss, wrong / (2 * n)


def _named(prefix: str, named: Iterable[tuple[str, nn.Parameter]],
           values: list[torch.Tensor]) -> Weights:
    """The unit's gradient sums by name: their own memory where they are float32 on the
    CPU (nothing else holds them once the unit is done), float32 copies otherwise."""
    return {prefix + name: _owned_float32(value)
            for (name, _), value in zip(named, values, strict=True)}


def _owned_float32(tensor: torch.Tensor) -> np.ndarray:
    array = tensor.detach().cpu().numpy()
    if array.dtype == np.float32 and array.flags.c_contiguous:
        return array
    return float32_copy(tensor)


def _buffers(module: nn.Module, prefix: str) -> Weights:
    return {prefix + name: float32_copy(b) for name, b in module.named_buffers()}


# Built (G, D) pairs kept between units, by GAN spec and device.
_MODULES: ModulePool[tuple[nn.Module, nn.Module]] = ModulePool()


def run_gan_unit(job: UnitJob, config: Mapping[str, Any], real: torch.Tensor,
                 share: tuple[int, int] | None = None) -> UnitOutput:
    spec = gan_models.gan_spec(job.model, config["batchnorm"])
    def build() -> tuple[nn.Module, nn.Module]:
        g, d = gan_models.build_gan(spec)
        return g.to(job.device), d.to(job.device)

    with _MODULES.borrow((spec, job.device), build) as (g, d):
        return _gan_unit_with(g, d, spec, job, config, real, share)


def _gan_unit_with(g: nn.Module, d: nn.Module, spec: gan_models.GanSpec, job: UnitJob,
                   config: Mapping[str, Any], real: torch.Tensor,
                   share: tuple[int, int] | None = None) -> UnitOutput:
    """``share`` (first row, unit size): ``real`` is that share of a larger unit."""
    try:
        gan_models.numpy_to_state(g, job.weights, "G.")
        gan_models.numpy_to_state(d, job.weights, "D.")
    except ValueError as exc:
        raise ConfigError(f"weights do not fit {job.model}: {exc}") from exc
    # The noise is drawn on the CPU, so a unit's fakes are the same on every device.
    first, size = share or (0, len(real))
    z = unit_noise(spec.z_dim, size, config["seed"], job.round, job.unit.unit_id)
    z = z[first:first + len(real)]
    real, z = real.to(job.device), z.to(job.device)
    update, loss, error = gan_unit_update(g, d, real, z, config["batch_size"],
                                          job.control.step)
    return UnitOutput(update=update, num_samples=len(real), loss=loss, error=error)


class GanState:
    """G and D with one Adam each; the modules stay in eval mode (they are only scored)."""

    def __init__(self, model: str, config: Mapping[str, Any], probe: torch.Tensor) -> None:
        self.spec = gan_models.gan_spec(model, config["batchnorm"])
        self.model = model
        self.g, self.d = gan_models.build_gan(self.spec, seed=config["seed"])
        betas = (config["beta1"], config["beta2"])
        self.opt_g = torch.optim.Adam(self.g.parameters(), lr=config["lr_g"], betas=betas)
        self.opt_d = torch.optim.Adam(self.d.parameters(), lr=config["lr_d"], betas=betas)
        self.g.eval()
        self.d.eval()
        self.probe = probe
        self.probe_z = torch.randn(len(probe), self.spec.z_dim,
                                   generator=torch.Generator().manual_seed(PROBE_SEED))
        # the names an average holds: the modules' structure never changes
        self._combined_names = [GRAD + name for name in self._names("named_parameters")] + \
            [BUFFER + name for name in self._names("named_buffers")]
        # The weights G and D hold: the dict `step` returned last (or `load` was given),
        # whose arrays are copies nothing writes to, so loading it again is skipped.
        self._held: Weights | None = None

    def weights(self) -> Weights:
        return {**gan_models.state_to_numpy(self.g, "G."),
                **gan_models.state_to_numpy(self.d, "D.")}

    def load(self, weights: Weights) -> None:
        """G and D set to ``weights``, unless they hold that very dict already (each
        round's step is given the weights the step before returned)."""
        if weights is self._held:
            return
        self._held = None  # a failed load leaves nothing known
        gan_models.numpy_to_state(self.g, weights, "G.")
        gan_models.numpy_to_state(self.d, weights, "D.")
        self._held = weights

    def step(self, weights: Weights, average: Weights) -> Weights:
        check_combined_names(average, self._combined_names)
        self.load(weights)
        self._held = None  # the step changes them
        for prefix, module in (("G.", self.g), ("D.", self.d)):
            gan_models.numpy_to_gradients(module, average, GRAD + prefix)
        self.opt_g.step()
        self.opt_d.step()
        for prefix, module in (("G.", self.g), ("D.", self.d)):
            _set_buffers(module, average, BUFFER + prefix)
        self._held = self.weights()
        return self._held

    def parameter_names(self) -> list[str]:
        return self._names("named_parameters")

    def _names(self, method: str) -> list[str]:
        return [prefix + name for prefix, module in (("G.", self.g), ("D.", self.d))
                for name, _ in getattr(module, method)()]

    @torch.no_grad()
    def evaluate(self, weights: Weights) -> RoundEval:
        self.load(weights)
        d_loss, _, wrong = gan_losses(self.g, self.d, self.probe, self.probe_z)
        return RoundEval(validation_error=int(wrong) / (2 * len(self.probe)),
                         validation_loss=float(d_loss))

    def description(self) -> dict[str, Any]:
        return {"model": self.model, "gan": self.spec.to_dict()}

    def optimizers(self) -> dict[str, tuple[dict[str, torch.Tensor], torch.optim.Optimizer]]:
        return {"G": (dict(self.g.named_parameters()), self.opt_g),
                "D": (dict(self.d.named_parameters()), self.opt_d)}


def _set_buffers(module: nn.Module, average: Mapping[str, np.ndarray], prefix: str) -> None:
    """Install averaged buffers; integer ones (BN's batch counter) are rounded."""
    for name, buffer in module.named_buffers():
        value = np.asarray(average[prefix + name])
        if not buffer.is_floating_point():
            value = np.rint(value)
        copy_into(buffer, value)
