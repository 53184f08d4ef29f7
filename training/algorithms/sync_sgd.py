"""Synchronous SGD with K-of-N partial synchronisation: averaged gradients, Adam on the coordinator.

Each round (= iteration, one update of the global model) the coordinator issues N work units
(``units_per_iteration``) of ``images_per_work_unit`` samples each; the first K
(``num_workunits_per_update``) results end the round and the others are cancelled. A node
computes the MEAN gradient of the loss over its unit (in micro-batches of ``batch_size``,
accumulated), the engine averages the K results weighted by their sample counts, and the
coordinator feeds that average to ``torch.optim.Adam`` as ``.grad``. Without BatchNorm, and
with K = N, this is exactly one Adam step on the concatenated global batch (tested).

Work units walk through the training part of the data set in order: the data set is cut into
``ceil(size / images_per_work_unit)`` consecutive index ranges (the last one shorter), and the
units of the whole run take them one after another, N per round, wrapping to the start after
the last one. An epoch (one pass over the data set) is therefore ``ceil(size / unit) / N``
rounds; the N - K units cancelled by the quorum are skipped for that epoch (their samples come
back in the next one). A unit's ``unit_path`` names the file that holds its first sample
(the node's handler checks that it exists); the node reads the range from its own copy.

Models and data sets:

* ``mlp``: the letters MLP (``training/models/mlp.py``) on a letters folder; the training
  part is the ``train_*`` files concatenated in natural order, the validation error is
  measured on ``validate_*`` after every round.
* any torch model (``mlp_classifier`` or a plug-in ``module:attribute``) on the data set
  ``run.dataset`` names: training/algorithms/torch_model.py, with the optimizer ``optimizer``
  (adam, adamw or sgd), ``lr`` and ``weight_decay`` on the coordinator;
* ``dcgan28`` / ``dcgan28-wide`` (twice the channels) / ``dcgan28-tiny`` and the MLP GANs
  ``mlpgan28`` / ``mlpgan28-tiny``: MNIST (``training/data/mnist.py``, the 8,000-image
  training part);
  ``dcgan64`` / ``dcgan64-tiny``: any image folder (``training/data/image_folder.py``).

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

Names on the wire. Weights: ``G.<state_dict name>`` / ``D.<state_dict name>`` (parameters and
buffers, float32), or the MLP's own ``W``, ``W2``, ..., ``V``. Updates: ``grad.<weight name>``
for every parameter and ``buffer.<weight name>`` for every buffer (e.g. ``grad.D.net.0.weight``,
``buffer.G.project.1.running_mean``).

Per-round evaluation must stay cheap. For the MLP it is the validation error and loss. For a
GAN there is no validation error: ``evaluate`` returns the current D's error rate and BCE loss
on a fixed probe of 64 real images (MNIST: the first held-out ones; an image folder: its first
images) and 64 fakes from fixed noise, both models in eval mode. An error near 0.5 means D
cannot tell G's images from real ones; it is a progress proxy, not a quality metric (FID).
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from training import schema
from training.aggregation import SECTION as AGGREGATION
from training.algorithms import torch_model
from training.algorithms.base import (
    AveragingAlgorithm,
    ConfigError,
    RoundEval,
    TensorSpecs,
    UnitJob,
    UnitOutput,
    UnitSpec,
    Weights,
    check_round_size,
    check_type,
    specs_of,
    split_aggregation,
    with_workload,
)
from training.cancel import no_step
from training.data import image_folder, mnist
from training.data.letters import load_letters
from training.models import gan_models, mlp
from training.models.modules import copy_into
from training.models.names import GAN_MODELS, is_module_model
from training.models.pool import ModulePool
from training.outputs import gan_metrics
from training.unit_parts import part_bounds

GRAD = "grad."
BUFFER = "buffer."
PROBE_SIZE = 64  # real and fake images scored by a GAN's cheap per-round evaluation
PROBE_SEED = 12345

MLP_BETAS = (0.9, 0.999)  # the usual Adam betas; only the GANs' betas are settings
# One config file serves every model, so keys meant for the other kind of model are
# accepted and dropped rather than refused.
ALL_KEYS = frozenset(schema.defaults(schema.SyncSgdSettings))
POSITIVE_INTS = ("images_per_work_unit", "num_workunits_per_update", "units_per_iteration",
                 "batch_size")


# ------------------------------------------------------------------ configuration


def defaults_for(model: str) -> dict[str, Any]:
    """Every config key the model understands, with its default."""
    if model in GAN_MODELS:
        return schema.sync_sgd_defaults(schema.GAN)
    return schema.sync_sgd_defaults(schema.MLP if model == "mlp" else schema.MODULE)


def _check_ranges(config: Mapping[str, Any]) -> None:
    for key in POSITIVE_INTS:
        if config[key] < 1:
            raise ConfigError(f"config key {key!r} must be at least 1, got {config[key]}")
    if config["units_per_iteration"] < config["num_workunits_per_update"]:
        raise ConfigError("config key 'units_per_iteration' (N) must be at least "
                          "'num_workunits_per_update' (K)")
    for key in ("lr", "lr_g", "lr_d"):
        if key in config and not (math.isfinite(config[key]) and config[key] > 0):
            raise ConfigError(f"config key {key!r} must be a positive number, got {config[key]}")
    for key in ("beta1", "beta2"):
        if key in config and not 0.0 <= config[key] < 1.0:
            raise ConfigError(f"config key {key!r} must be in [0, 1), got {config[key]}")
    if not 0 <= config["seed"] < 2**31:
        raise ConfigError(f"config key 'seed' must be in [0, 2**31), got {config['seed']}")
    if "optimizer" in config and config["optimizer"] not in torch_model.OPTIMIZERS:
        raise ConfigError(f"config key 'optimizer' must be one of "
                          f"{', '.join(torch_model.OPTIMIZERS)}, got {config['optimizer']!r}")
    if "weight_decay" in config and not (math.isfinite(config["weight_decay"])
                                         and config["weight_decay"] >= 0):
        raise ConfigError(f"config key 'weight_decay' must be 0 or more, "
                          f"got {config['weight_decay']}")


# ------------------------------------------------------------------ data sets


class _Letters:
    """The letters training part: the ``train_*`` files concatenated in natural order."""

    def __init__(self, folder: Path) -> None:
        files = sorted((p for p in folder.glob("train_*") if p.is_file()),
                       key=lambda p: [int(s) if s.isdigit() else s
                                      for s in re.split(r"(\d+)", p.name)])
        if not files:
            raise ConfigError(f"no train_* files in {folder}: the MLP trains on them")
        parts = [load_letters(path) for path in files]
        self.features = np.concatenate([x for x, _ in parts])
        self.labels = np.concatenate([y for _, y in parts])
        self.ends = np.cumsum([len(y) for _, y in parts])
        self.names = [p.name for p in files]

    def __len__(self) -> int:
        return len(self.labels)

    def path_of(self, index: int) -> str:
        return self.names[int(np.searchsorted(self.ends, index, side="right"))]

    def load(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        mnist.check_index_range(start, stop, len(self), "the letters training part")
        return self.features[start:stop], self.labels[start:stop]


class _Mnist:
    """The MNIST training part (8,000 images); every unit lies in the images file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.size = len(mnist.training_part(folder)[0])

    def __len__(self) -> int:
        return self.size

    def path_of(self, index: int) -> str:
        return mnist.IMAGES_FILE

    def load(self, start: int, stop: int) -> torch.Tensor:
        return mnist.training_range(start, stop, self.folder)

    def probe(self) -> torch.Tensor:
        return mnist.to_model_input(mnist.held_out_part(self.folder)[0][:PROBE_SIZE])


class _Folder:
    """An image folder at 64x64; a unit is named by the relative path of its first image."""

    def __init__(self, folder: Path) -> None:
        self.images = image_folder.ImageFolder(folder)

    def __len__(self) -> int:
        return len(self.images)

    def path_of(self, index: int) -> str:
        return self.images.paths[index].relative_to(self.images.folder).as_posix()

    def load(self, start: int, stop: int) -> torch.Tensor:
        return self.images.load_range(start, stop)

    def probe(self) -> torch.Tensor:
        return self.images.load_range(0, min(PROBE_SIZE, len(self.images)))


class _Examples:
    """A torch model's training part as the units see it: index ranges, no files."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def path_of(self, index: int) -> str:
        return ""


@functools.lru_cache(maxsize=4)
def _data(model: str, folder: str) -> _Letters | _Mnist | _Folder:
    """The training part of a data set, read once per process (a node serves many units)."""
    try:
        if model == "mlp":
            return _Letters(Path(folder))
        if gan_models.is_mnist_model(model):
            return _Mnist(Path(folder))
        return _Folder(Path(folder))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data set {folder} cannot serve model {model!r}: {exc}") from exc


def _dataset(model: str, folder: Path) -> _Letters | _Mnist | _Folder:
    return _data(model, str(folder.resolve()))


# ------------------------------------------------------------------ randomness


def unit_seed(seed: int, round_index: int, unit_id: str) -> int:
    """A seed that depends on the unit, not on the node that runs it."""
    return (seed * 1_000_003 + round_index * 7919 + zlib.crc32(unit_id.encode())) % (2**31)


def unit_noise(z_dim: int, n: int, seed: int, round_index: int, unit_id: str) -> torch.Tensor:
    """The noise (n, z_dim) behind a unit's fakes; drawn at once so that the micro-batch size
    cannot change it."""
    generator = torch.Generator().manual_seed(unit_seed(seed, round_index, unit_id))
    return torch.randn(n, z_dim, generator=generator)


# ------------------------------------------------------------------ node maths


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


def _float32(tensor: torch.Tensor) -> np.ndarray:
    """A float32 copy: a view would let a later step change an update waiting to be sent."""
    return np.array(tensor.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)


def _named(prefix: str, named: Iterable[tuple[str, nn.Parameter]],
           values: list[torch.Tensor]) -> Weights:
    return {prefix + name: _float32(value)
            for (name, _), value in zip(named, values, strict=True)}


def _buffers(module: nn.Module, prefix: str) -> Weights:
    return {prefix + name: _float32(b) for name, b in module.named_buffers()}


def mlp_unit_gradients(weights: Mapping[str, np.ndarray], features: np.ndarray,
                       labels: np.ndarray, spec: mlp.MLPSpec, batch_size: int,
                       step: Callable[[], None] = no_step) -> Weights:
    """The mean cross-entropy gradient over the unit, summed over micro-batches in float64
    (mlp's own backpropagation), returned as float32 ``grad.<name>`` arrays. ``step`` is
    called before every micro-batch (a node's cancel check)."""
    params = {name: np.asarray(value, dtype=np.float64) for name, value in weights.items()}
    inputs = mlp._inputs(features, spec)
    total = {name: np.zeros_like(value) for name, value in params.items()}
    for start in range(0, len(labels), batch_size):
        step()
        acts, pres = mlp._hidden_pass(params, inputs[start:start + batch_size], spec)
        probs = mlp._softmax(mlp._affine(acts[-1], params["V"]))
        grad_out = mlp._output_grad(probs, labels[start:start + batch_size])
        for name, grad in mlp._gradients(params, acts, pres, grad_out, spec).items():
            total[name] += grad
    return {GRAD + name: (value / len(labels)).astype(np.float32) for name, value in total.items()}


# ------------------------------------------------------------------ the algorithm


class SyncSGD(AveragingAlgorithm):
    """See the module docstring."""

    name = "sync_sgd"
    models = ("mlp", *GAN_MODELS)
    asynchronous = True  # gradients can be applied one by one as they arrive
    rounds_from_passes = True  # units cut by K-of-N are trained on later in the pass
    splits_units = True

    @classmethod
    def writes_weights(cls, model: str) -> bool:
        return not is_module_model(model)  # a torch model only loads them into its module

    @classmethod
    def trains(cls, model: str) -> bool:
        return model in cls.models or is_module_model(model)

    @classmethod
    def compression_codecs(cls, model: str) -> dict[str, frozenset[str]]:
        """topk for the MLP and other torch models (whose buffers, BatchNorm statistics,
        travel whole under it), not for the GANs."""
        up = {"fp16", "int8"} if model in GAN_MODELS else {"fp16", "int8", "topk"}
        return {"up": frozenset(up), "down": frozenset({"fp16"})}

    @classmethod
    def unit_slot(cls, unit: UnitSpec, config: Mapping[str, Any]) -> str:
        """Unit ids run on over the iterations (unit<number>-<start>-<stop>); the slot is
        the unit's place in its iteration."""
        number = re.match(r"unit(\d+)-", unit.unit_id)
        per_iteration = config.get("units_per_iteration")
        if number is None or not isinstance(per_iteration, int) or per_iteration < 1:
            return unit.unit_id
        return f"slot{int(number.group(1)) % per_iteration}"

    # ------------------------------------------------------------- node half
    @classmethod
    def check_config(cls, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config with every default filled in (N defaults to K + 1: one spare unit per
        round, so a straggler or a unit stuck in a load delay does not hold the round)."""
        cls.check_model(model)
        defaults = defaults_for(model)
        given, (config, aggregation) = config, split_aggregation(config)
        unknown = sorted(set(config) - ALL_KEYS)
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0]!r} for {cls.name}; "
                              f"known: {', '.join(sorted(ALL_KEYS))}")
        if "units_per_iteration" not in config:
            k = config.get("num_workunits_per_update", defaults["num_workunits_per_update"])
            if isinstance(k, int):
                defaults["units_per_iteration"] = k + 1
        checked = {key: check_type(key, config.get(key, value), value)
                   for key, value in defaults.items()}
        _check_ranges(checked)
        return with_workload({**checked, AGGREGATION: aggregation}, given)

    @classmethod
    def run_unit(cls, job: UnitJob, dataset_dir: Path) -> UnitOutput:
        config = cls.check_config(job.model, job.config)
        start, stop = job.unit.index_start, job.unit.index_stop
        if start is None or stop is None:
            raise ConfigError(f"unit {job.unit.unit_id} has no index range; {cls.name} needs one")
        if is_module_model(job.model):
            return torch_model.sync_unit(job, dataset_dir, start, stop, config["batch_size"])
        data = _dataset(job.model, dataset_dir)
        if job.model == "mlp":
            return _run_mlp_unit(job, config, *data.load(start, stop))
        return _run_gan_unit(job, config, data.load(start, stop))

    @classmethod
    def run_unit_part(cls, job: UnitJob, dataset_dir: Path, part: int,
                      parts: int) -> UnitOutput | None:
        """The mean gradient over a share of the unit's range cut at micro-batch bounds; a
        GAN's share takes its rows of the unit's noise, so the shares' sample-weighted
        mean is the unit's gradient."""
        config = cls.check_config(job.model, job.config)
        start, stop = job.unit.index_start, job.unit.index_stop
        if start is None or stop is None:
            raise ConfigError(f"unit {job.unit.unit_id} has no index range; {cls.name} needs one")
        lo, hi = part_bounds(stop - start, part, parts, config["batch_size"])
        if lo == hi:
            return None
        if is_module_model(job.model):
            return torch_model.sync_unit(job, dataset_dir, start + lo, start + hi,
                                         config["batch_size"])
        data = _dataset(job.model, dataset_dir)
        if job.model == "mlp":
            return _run_mlp_unit(job, config, *data.load(start + lo, start + hi))
        return _run_gan_unit(job, config, data.load(start + lo, start + hi), (lo, stop - start))

    # ------------------------------------------------------ coordinator half
    def __init__(self, model: str, config: Mapping[str, Any], dataset_dir: Path,
                 dataset: str | None = None) -> None:
        super().__init__(model, config, dataset_dir, dataset)
        # The first K results of a round are combined.
        check_round_size(self.config[AGGREGATION], self.quorum(self.config["units_per_iteration"]))
        self.unit_size = self.config["images_per_work_unit"]
        self.state: _MlpState | _GanState | torch_model.SyncState
        if is_module_model(model):
            setup = torch_model.setup_of(model, self.config, self.dataset, dataset_dir)
            self.data: _Letters | _Mnist | _Folder | _Examples = _Examples(len(setup.data.train))
            self.state = torch_model.SyncState(setup, self.config)
        elif model == "mlp":
            self.data = _dataset(model, dataset_dir)
            self.state = _MlpState(self.config, dataset_dir)
        else:
            self.data = _dataset(model, dataset_dir)
            self.state = _GanState(model, self.config, self.data.probe())
        self.units_per_epoch = math.ceil(len(self.data) / self.unit_size)

    def initial_weights(self) -> Weights:
        return self.state.weights()

    def plan_round(self, round_index: int) -> list[UnitSpec]:
        count = self.config["units_per_iteration"]
        return [self._unit((round_index - 1) * count + j) for j in range(count)]

    def _unit(self, number: int) -> UnitSpec:
        """The run's ``number``-th unit (0-based): the next range, wrapping at the end."""
        start = number % self.units_per_epoch * self.unit_size
        stop = min(start + self.unit_size, len(self.data))
        return UnitSpec(unit_id=f"unit{number}-{start}-{stop}",
                        unit_path=self.data.path_of(start), index_start=start, index_stop=stop)

    def plan_pass(self, pass_index: int) -> list[UnitSpec]:
        """Every range of the data set once; unit numbers run on over the passes."""
        first = (pass_index - 1) * self.units_per_epoch
        return [self._unit(first + j) for j in range(self.units_per_epoch)]

    def staleness_scaled(self, name: str) -> bool:
        """Gradients are scaled; BatchNorm statistics are states, averaged as they are."""
        return name.startswith(GRAD)

    def unit_samples(self, unit: UnitSpec) -> int | None:
        if unit.index_start is None or unit.index_stop is None:
            return None
        return unit.index_stop - unit.index_start

    def epochs_done(self, round_index: int) -> float:
        """K units of each round count; the cancelled ones come round again next epoch."""
        return round_index * self.quorum(self.config["units_per_iteration"]) / self.units_per_epoch

    def quorum(self, num_units: int) -> int:
        return min(self.config["num_workunits_per_update"], num_units)

    def expected_update(self, weights: Weights) -> TensorSpecs:
        """Gradients of the parameters and the BatchNorm buffers, shaped and typed as the
        weights they belong to."""
        if isinstance(self.state, torch_model.SyncState):
            return torch_model.expected_update(self.state.module, weights, gradients=True)
        params = set(self.state.parameter_names())
        return {(GRAD if name in params else BUFFER) + name: spec
                for name, spec in specs_of(weights).items()}

    def apply(self, weights: Weights, combined: Weights) -> Weights:
        return self.state.step(weights, combined)

    def evaluate(self, weights: Weights) -> RoundEval:
        return self.state.evaluate(weights)

    def model_description(self) -> dict[str, Any]:
        return self.state.description()

    def sample_images(self, weights: Weights, n: int, seed: int = 0) -> np.ndarray | None:
        """n images from ``weights``' generator (not necessarily the last one stepped:
        a saved state's, for instance)."""
        if not isinstance(self.state, _GanState):
            return None
        gan_models.numpy_to_state(self.state.g, weights, "G.")
        return gan_models.sample_images(self.state.g, n, seed).numpy()

    def score(self, weights: Weights, n: int) -> dict[str, float]:
        """IS and FID (classifier features and logits) of ``weights``' generator, for
        the 28x28 MNIST models."""
        if not (isinstance(self.state, _GanState) and gan_models.is_mnist_model(self.model)):
            return {}
        gan_models.numpy_to_state(self.state.g, weights, "G.")
        images = gan_models.sample_images(self.state.g, n, seed=gan_metrics.SCORE_SEED)
        return gan_metrics.score_images(images, n, root=self.dataset_dir).to_dict()

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"optim.{group}.{key}": value
                for group, (named, optimizer) in self.state.optimizers().items()
                for key, value in _optimizer_arrays(named, optimizer).items()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        for group, (named, optimizer) in self.state.optimizers().items():
            _load_optimizer_arrays(named, optimizer, state, f"optim.{group}.")


def _load_optimizer_arrays(named: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                           state: Mapping[str, np.ndarray], prefix: str) -> None:
    """Put Adam's step and moments back from the arrays `_optimizer_arrays` made."""
    for name, param in named.items():
        keys = {key[len(prefix) + len(name) + 1:]: value for key, value in state.items()
                if key.startswith(f"{prefix}{name}.")}
        if keys:
            optimizer.state[param] = {key: torch.from_numpy(np.array(value, copy=True))
                                      for key, value in keys.items()}


def _optimizer_arrays(named: Mapping[str, torch.Tensor],
                      optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """Adam's step and moments per parameter, keyed ``<param>.<state key>``."""
    return {f"{name}.{key}": np.array(value.detach().cpu().numpy(), dtype=np.float32)
            for name, param in named.items()
            for key, value in optimizer.state.get(param, {}).items()}


# ------------------------------------------------------------------ node halves


def _run_mlp_unit(job: UnitJob, config: Mapping[str, Any], features: np.ndarray,
                  labels: np.ndarray) -> UnitOutput:
    spec = _mlp_spec(config)
    mlp._check_params(job.weights, spec)
    update = mlp_unit_gradients(job.weights, features, labels, spec, config["batch_size"],
                                job.control.step)
    error, loss = mlp.evaluate(job.weights, features, labels, spec)
    return UnitOutput(update=update, num_samples=len(labels), loss=loss, error=error)


# Built (G, D) pairs kept between units, by GAN spec and device.
_MODULES: ModulePool[tuple[nn.Module, nn.Module]] = ModulePool()


def _run_gan_unit(job: UnitJob, config: Mapping[str, Any], real: torch.Tensor,
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


def _mlp_spec(config: Mapping[str, Any]) -> mlp.MLPSpec:
    return mlp.MLPSpec(hidden=tuple(config["hidden"]), scale_features=config["scale_features"])


# ------------------------------------------------------------------ coordinator states


def _check_update(average: Mapping[str, np.ndarray], expected: list[str]) -> None:
    """A partial or foreign update is a bug somewhere; refuse it before any step."""
    if sorted(average) != sorted(expected):
        missing = sorted(set(expected) - set(average))[:3]
        unexpected = sorted(set(average) - set(expected))[:3]
        raise ValueError(f"averaged update does not match the model: missing {missing}, "
                         f"unexpected {unexpected}")


class _MlpState:
    """The MLP's parameters as float32 torch leaves and their Adam optimizer."""

    def __init__(self, config: Mapping[str, Any], dataset_dir: Path) -> None:
        self.spec = _mlp_spec(config)
        initial = mlp.init_params(self.spec, seed=config["seed"])
        self.params = {name: torch.tensor(value, dtype=torch.float32, requires_grad=True)
                       for name, value in initial.items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=config["lr"],
                                          betas=MLP_BETAS)
        self.validation = _letters_validation(dataset_dir)

    def weights(self) -> Weights:
        return {name: _float32(p) for name, p in self.params.items()}

    def step(self, weights: Weights, average: Weights) -> Weights:
        _check_update(average, [GRAD + name for name in self.params])
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(torch.from_numpy(np.asarray(weights[name], dtype=np.float32)))
                param.grad = torch.from_numpy(np.asarray(average[GRAD + name], np.float32))
        self.optimizer.step()
        return self.weights()

    def evaluate(self, weights: Weights) -> RoundEval:
        error, loss = mlp.evaluate(weights, *self.validation, self.spec)
        return RoundEval(validation_error=float(error), validation_loss=float(loss))

    def description(self) -> dict[str, Any]:
        return {"model": "mlp", "spec": self.spec.to_dict()}

    def optimizers(self) -> dict[str, tuple[dict[str, torch.Tensor], torch.optim.Optimizer]]:
        return {"mlp": (self.params, self.optimizer)}

    def parameter_names(self) -> list[str]:
        return list(self.params)


def _letters_validation(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    files = sorted(p for p in folder.glob("validate_*") if p.is_file())
    if not files:
        raise ConfigError(f"no validate_* file in {folder}: the validation set is needed")
    return load_letters(files[0])


class _GanState:
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

    def weights(self) -> Weights:
        return {**gan_models.state_to_numpy(self.g, "G."),
                **gan_models.state_to_numpy(self.d, "D.")}

    def step(self, weights: Weights, average: Weights) -> Weights:
        expected = [GRAD + name for name in self._names("named_parameters")]
        _check_update(average, expected + [BUFFER + n for n in self._names("named_buffers")])
        for prefix, module in (("G.", self.g), ("D.", self.d)):
            gan_models.numpy_to_state(module, weights, prefix)
            gan_models.numpy_to_gradients(module, average, GRAD + prefix)
        self.opt_g.step()
        self.opt_d.step()
        for prefix, module in (("G.", self.g), ("D.", self.d)):
            _set_buffers(module, average, BUFFER + prefix)
        return self.weights()

    def parameter_names(self) -> list[str]:
        return self._names("named_parameters")

    def _names(self, method: str) -> list[str]:
        return [prefix + name for prefix, module in (("G.", self.g), ("D.", self.d))
                for name, _ in getattr(module, method)()]

    @torch.no_grad()
    def evaluate(self, weights: Weights) -> RoundEval:
        gan_models.numpy_to_state(self.g, weights, "G.")
        gan_models.numpy_to_state(self.d, weights, "D.")
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
