"""A multi-layer perceptron in plain numpy: the maths a compute node runs on one shard.

Parameters are a dict of matrices, one per layer, each with its bias as the FIRST ROW, so
that a layer computes ``[1, Z] @ M`` as in the assignment. With one hidden layer the names
are ``"W"`` ((n_in+1) x H) and ``"V"`` ((H+1) x n_out); deeper networks use ``"W"``,
``"W2"``, ``"W3"``, ... and then ``"V"``.

Two behaviours share the code:

* ``compat=True`` reproduces the assignment's reference library bit for bit in its maths:
  its hidden "ReLU" returns its input on both branches (a linear forward pass) while its
  backward pass multiplies by the mask ``pre-activation >= 0``; the loss is cross-entropy
  summed over rows with ``+1e-6`` inside the log; full-batch gradient descent stops early
  once the summed loss changes by at most 0.2 between epochs; features are not scaled.
* ``compat=False`` (the default) is a correct ReLU network trained on the mean
  cross-entropy with the chosen optimizer, optional feature scaling, no early stop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from thrift_trainer.training.cancel import no_step

Params = dict[str, np.ndarray]

OPTIMIZERS = ("gd", "sgd", "adam")
FEATURE_MAX = 15.0  # letters features are integers 0..15; scaling maps them into [0, 1]
COMPAT_LOG_EPS = 1e-6  # the reference adds this inside the log of its loss
COMPAT_STOP_DELTA = 0.2  # the reference stops when the summed loss moves by at most this
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def _check_field(owner: str, name: str, value: Any, kind: type) -> None:
    """Raise ValueError naming ``owner.name`` unless ``value`` is a ``kind`` (bool is no int)."""
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise ValueError(f"{owner}.{name} must be {kind.__name__}, got {value!r}")


def _from_mapping(cls: type, data: Mapping[str, Any]) -> Any:
    """Build the dataclass ``cls`` from a mapping, rejecting keys it does not define."""
    known = {field.name for field in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ValueError(f"{cls.__name__}: unknown key {key!r} (known: {sorted(known)})")
    return cls(**data)


@dataclass(frozen=True)
class MLPSpec:
    """Shape and behaviour of the network; everything a node needs besides the weights."""

    n_in: int = 16
    hidden: tuple[int, ...] = (20,)
    n_out: int = 26
    compat: bool = False
    scale_features: bool = False

    def __post_init__(self) -> None:
        for name in ("n_in", "n_out"):
            _check_field("MLPSpec", name, getattr(self, name), int)
            if getattr(self, name) < 1:
                raise ValueError(f"MLPSpec.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("compat", "scale_features"):
            _check_field("MLPSpec", name, getattr(self, name), bool)
        if not isinstance(self.hidden, (tuple, list)) or not self.hidden:
            raise ValueError(f"MLPSpec.hidden must be a non-empty tuple, got {self.hidden!r}")
        for width in self.hidden:
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise ValueError(f"MLPSpec.hidden must hold ints >= 1, got {self.hidden!r}")
        # JSON brings lists; a tuple keeps the frozen spec hashable.
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if self.compat and self.scale_features:
            raise ValueError("MLPSpec.scale_features: the reference (compat) does not scale")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``hidden`` as a list)."""
        return {**dataclasses.asdict(self), "hidden": list(self.hidden)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MLPSpec:
        """Inverse of :meth:`to_dict`; missing keys take their defaults."""
        return _from_mapping(cls, data)

    def layer_names(self) -> tuple[str, ...]:
        """Parameter names from input to output: W, W2, ..., V."""
        hidden = ["W"] + [f"W{i}" for i in range(2, len(self.hidden) + 1)]
        return (*hidden, "V")

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """Each parameter's shape, bias row included."""
        widths = (self.n_in, *self.hidden, self.n_out)
        return {name: (widths[i] + 1, widths[i + 1]) for i, name in enumerate(self.layer_names())}


@dataclass(frozen=True)
class LocalTraining:
    """How a node trains on its shard for one round.

    ``gd`` is the assignment's full-batch rule: each epoch subtracts ``eta`` times the
    gradient of the loss SUMMED over the shard's rows, so an assignment ``eta`` such as 1e-4
    means the same in both modes. ``sgd`` and ``adam`` step on the MEAN gradient of each
    minibatch, as usual for those optimizers; ``seed`` drives their shuffling.
    """

    epochs: int
    eta: float
    optimizer: str = "gd"
    batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "seed"):
            _check_field("LocalTraining", name, getattr(self, name), int)
        _check_field("LocalTraining", "eta", self.eta, float)
        if self.epochs < 0 or self.batch_size < 1 or not 0 <= self.seed < 2**32:
            raise ValueError(
                f"LocalTraining: need epochs >= 0, batch_size >= 1, 0 <= seed < 2**32; got {self}"
            )
        if not (math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"LocalTraining.eta must be finite and > 0, got {self.eta!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"LocalTraining.optimizer {self.optimizer!r} unknown; known: {OPTIMIZERS}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LocalTraining:
        """Inverse of :meth:`to_dict`; ``epochs`` and ``eta`` are required."""
        return _from_mapping(cls, data)


@dataclass(frozen=True)
class TrainStats:
    """What a node reports besides its delta; loss and error are measured after training."""

    loss: float  # mean per-sample cross-entropy on the shard
    error: float  # training error rate on the shard
    num_samples: int
    epochs_run: int  # fewer than asked when the compat early stop fired


def init_params(spec: MLPSpec, seed: int = 1) -> Params:
    """Initial weights, drawn from a private ``RandomState(seed)``.

    ``RandomState(seed)`` yields the same stream as the reference's ``np.random.seed(seed)``
    without touching the global generator. Draw order: V first, then W, W2, ...

    * compat, or one hidden layer: the reference init, every entry (biases too)
      ``rand() * 0.02 - 0.01``, so that the default mode starts from the reference's
      weights and its numbers stay comparable (README: 0.7691 after 5 rounds).
    * two or more hidden layers (non-compat): He-uniform weights (limit sqrt(6 / fan_in))
      and zero biases. The +-0.01 init shrinks the signal by ~100x per layer, so a deep
      ReLU net starts with vanishing activations and gradients; He scaling keeps the
      activation variance constant through the ReLU layers.
    """
    rng = np.random.RandomState(seed)
    shapes = spec.layer_shapes()
    order = ("V", *spec.layer_names()[:-1])
    reference = spec.compat or len(spec.hidden) == 1
    params: Params = {}
    for name in order:
        draw = rng.rand(*shapes[name])
        if reference:
            params[name] = draw * 0.02 - 0.01
        else:
            limit = math.sqrt(6.0 / (shapes[name][0] - 1))
            params[name] = (2.0 * draw - 1.0) * limit
            params[name][0] = 0.0
    return {name: params[name] for name in spec.layer_names()}


def forward(params: Params, X: np.ndarray, spec: MLPSpec) -> np.ndarray:
    """Class probabilities (n, n_out) for raw (unscaled) features ``X``."""
    acts, _ = _hidden_pass(params, _inputs(X, spec), spec)
    return _softmax(_affine(acts[-1], params["V"]))


def predict(params: Params, X: np.ndarray, spec: MLPSpec) -> np.ndarray:
    """Predicted labels (n,) int64."""
    return _logits(params, X, spec).argmax(axis=1)


def evaluate(params: Params, X: np.ndarray, y: np.ndarray, spec: MLPSpec) -> tuple[float, float]:
    """(error rate, mean per-sample cross-entropy) on ``X``, ``y``.

    In compat mode the loss is the reference's ``-log(p + 1e-6)``; otherwise the exact
    ``logsumexp(logits) - logit_y``, which stays finite however confident the net is.
    """
    y = _labels(y, len(X), spec)
    logits = _logits(params, X, spec)
    error = float(np.mean(logits.argmax(axis=1) != y))
    if spec.compat:
        return error, _compat_summed_loss(_softmax(logits), y) / len(y)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    return error, float(np.mean(log_norm - shifted[np.arange(len(y)), y]))


def train_local(
    params: Params, X: np.ndarray, y: np.ndarray, spec: MLPSpec, opt: LocalTraining,
    step: Callable[[], None] = no_step,
) -> tuple[Params, TrainStats]:
    """Train a copy of ``params`` on one shard; the inputs are left untouched.

    The caller computes ``delta = new - params`` (what a node sends back). ``step`` is
    called before every batch (every epoch of full-batch descent): a node's cancel check.
    """
    if spec.compat and opt.optimizer != "gd":
        raise ValueError(f"compat mode reproduces the reference's 'gd', not {opt.optimizer!r}")
    check_params(params, spec)
    y = _labels(y, len(X), spec)
    Xs = _inputs(X, spec)
    work = {name: np.array(value, dtype=np.float64) for name, value in params.items()}
    if opt.optimizer == "gd":
        epochs_run = _full_batch_descent(work, Xs, y, spec, opt, step)
    else:
        _minibatch_descent(work, Xs, y, spec, opt, step)
        epochs_run = opt.epochs
    error, loss = evaluate(work, X, y, spec)
    return work, TrainStats(loss=loss, error=error, num_samples=len(y), epochs_run=epochs_run)


def check_params(params: Params, spec: MLPSpec) -> None:
    """Fail early, naming the layer, when the weights do not fit the spec."""
    expected = spec.layer_shapes()
    if set(params) != set(expected):
        raise ValueError(f"parameters {sorted(params)} do not match the spec's {sorted(expected)}")
    for name, shape in expected.items():
        if np.shape(params[name]) != shape:
            raise ValueError(
                f"parameter {name!r} has shape {np.shape(params[name])}, the spec needs {shape}"
            )


def mean_gradients(
    params: Params, X: np.ndarray, y: np.ndarray, spec: MLPSpec, batch_size: int,
    step: Callable[[], None] = no_step,
) -> Params:
    """The mean cross-entropy gradient over ``X``, ``y`` in float64: micro-batches of
    ``batch_size`` backpropagated as local training does, summed, divided by the rows.
    ``step`` is called before every micro-batch (a node's cancel check)."""
    work = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    Xs = _inputs(X, spec)
    total = {name: np.zeros_like(value) for name, value in work.items()}
    for start in range(0, len(y), batch_size):
        step()
        acts, pres = _hidden_pass(work, Xs[start:start + batch_size], spec)
        probs = _softmax(_affine(acts[-1], work["V"]))
        grad_out = _output_grad(probs, y[start:start + batch_size])
        for name, grad in _gradients(work, acts, pres, grad_out, spec).items():
            total[name] += grad
    return {name: value / len(y) for name, value in total.items()}


# --------------------------------------------------------------------------- internals


def _labels(y: np.ndarray, n: int, spec: MLPSpec) -> np.ndarray:
    """Labels as int64, checked against the row count and the number of classes."""
    y = np.asarray(y)
    if (
        y.shape != (n,)
        or not np.issubdtype(y.dtype, np.integer)
        or (n and (y.min() < 0 or y.max() >= spec.n_out))
    ):
        raise ValueError(f"labels must be {n} integers in 0..{spec.n_out - 1}")
    return y.astype(np.int64, copy=False)


def _inputs(X: np.ndarray, spec: MLPSpec) -> np.ndarray:
    """Features as a float64 matrix, divided by FEATURE_MAX when the spec asks for it."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != spec.n_in:
        raise ValueError(f"features must be (n, {spec.n_in}), got {X.shape}")
    return X / FEATURE_MAX if spec.scale_features else X


def _affine(Z: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``[1, Z] @ M`` without building the ones column: the first row of M is the bias."""
    return Z @ M[1:] + M[0]


def _hidden_pass(
    params: Params, Xs: np.ndarray, spec: MLPSpec
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hidden activations [Xs, H1, ..., Hk] and pre-activations [A1, ..., Ak].

    Compat keeps ``H = A`` (the reference's ReLU returns its input on both branches).
    """
    acts, pres = [Xs], []
    for name in spec.layer_names()[:-1]:
        pre = _affine(acts[-1], params[name])
        pres.append(pre)
        acts.append(pre if spec.compat else np.maximum(pre, 0.0))
    return acts, pres


def _logits(params: Params, X: np.ndarray, spec: MLPSpec) -> np.ndarray:
    acts, _ = _hidden_pass(params, _inputs(X, spec), spec)
    return _affine(acts[-1], params["V"])


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax; subtracting the row max avoids overflow and changes nothing else."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    e /= (e @ np.ones(e.shape[1]))[:, None]  # row sums; a BLAS call beats .sum(axis=1) ~5x
    return e


def _compat_summed_loss(probs: np.ndarray, y: np.ndarray) -> float:
    """The reference's loss: -sum_i log(p_i,y_i + 1e-6); only the true class contributes."""
    return float(-np.log(probs[np.arange(len(y)), y] + COMPAT_LOG_EPS).sum())


def _gradients(
    params: Params,
    acts: list[np.ndarray],
    pres: list[np.ndarray],
    grad_out: np.ndarray,
    spec: MLPSpec,
) -> Params:
    """Backpropagate ``grad_out`` = dLoss/dlogits through every layer.

    For a layer ``A = [1, Z] @ M`` the gradient is ``[1, Z]^T G``: its bias row is the column
    sum of G. G moves down through ``M[1:]^T`` (the bias has no input) and the ReLU mask.
    Compat uses the reference's mask ``A >= 0`` even though its forward pass ignored it.
    """
    names = spec.layer_names()
    grads: Params = {}
    g = grad_out
    for i in range(len(names) - 1, -1, -1):
        weights = params[names[i]]
        # ones @ g is the column sum of g (the bias row), and ~5x faster than g.sum(axis=0).
        grads[names[i]] = np.vstack([np.ones(len(g)) @ g, acts[i].T @ g])
        if i:
            mask = pres[i - 1] >= 0 if spec.compat else pres[i - 1] > 0
            g = (g @ weights[1:].T) * mask
    return grads


def _output_grad(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d(summed cross-entropy)/d(logits) = R - Y, computed in place on the probabilities.

    (The reference's +1e-6 is ignored here, as in its own update rule.)
    """
    probs[np.arange(len(y)), y] -= 1.0
    return probs


def _full_batch_descent(
    work: Params, Xs: np.ndarray, y: np.ndarray, spec: MLPSpec, opt: LocalTraining,
    step: Callable[[], None],
) -> int:
    """The assignment's ``train(eta, epochs)``: W -= eta * grad(summed loss). Epochs run.

    Compat checks the early stop at the top of each epoch: once the loss of the current
    weights is within 0.2 of the previous epoch's, it stops before updating again. (That
    reproduces the README's numbers; the stop fires in a few shards of a 25-round run.)
    """
    previous_loss = None
    for epoch in range(opt.epochs):
        step()
        acts, pres = _hidden_pass(work, Xs, spec)
        probs = _softmax(_affine(acts[-1], work["V"]))
        if spec.compat:
            loss = _compat_summed_loss(probs, y)
            if previous_loss is not None and abs(loss - previous_loss) <= COMPAT_STOP_DELTA:
                return epoch
            previous_loss = loss
        grads = _gradients(work, acts, pres, _output_grad(probs, y), spec)
        for name, grad in grads.items():
            work[name] -= opt.eta * grad
    return opt.epochs


def _minibatch_descent(
    work: Params, Xs: np.ndarray, y: np.ndarray, spec: MLPSpec, opt: LocalTraining,
    step: Callable[[], None],
) -> None:
    """Shuffled minibatch SGD or Adam on the mean cross-entropy of each batch.

    Adam's moments start from zero on every call: a round's local training is independent
    of the previous round's, so a node keeps no state between rounds.
    """
    rng = np.random.RandomState(opt.seed)
    adam = _Adam(work, opt.eta) if opt.optimizer == "adam" else None
    for _ in range(opt.epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), opt.batch_size):
            step()
            batch = order[start : start + opt.batch_size]
            acts, pres = _hidden_pass(work, Xs[batch], spec)
            probs = _softmax(_affine(acts[-1], work["V"]))
            grad_out = _output_grad(probs, y[batch]) / len(batch)  # mean, not sum
            grads = _gradients(work, acts, pres, grad_out, spec)
            if adam is None:
                for name, grad in grads.items():
                    work[name] -= opt.eta * grad
            else:
                adam.step(work, grads)


class _Adam:
    """Adam (Kingma & Ba) with bias correction, updating the weights in place.

    Every operation writes into preallocated buffers: for a 256x256 layer the temporaries of
    the textbook one-liner cost as much time as the layer's matrix products.
    """

    def __init__(self, work: Params, lr: float) -> None:
        self.lr = lr
        self.t = 0
        self.m = {name: np.zeros_like(value) for name, value in work.items()}
        self.v = {name: np.zeros_like(value) for name, value in work.items()}
        self.scratch = {name: np.empty_like(value) for name, value in work.items()}

    def step(self, work: Params, grads: Params) -> None:
        beta1, beta2 = ADAM_BETAS
        self.t += 1
        # w -= lr * m_hat / (sqrt(v_hat) + eps), with the bias corrections folded into scalars:
        # m_hat = m / (1 - beta1^t), sqrt(v_hat) = sqrt(v) / sqrt(1 - beta2^t).
        step_size = self.lr / (1.0 - beta1**self.t)
        inv_v_correction = 1.0 / math.sqrt(1.0 - beta2**self.t)
        for name, grad in grads.items():
            m, v, tmp = self.m[name], self.v[name], self.scratch[name]
            m *= beta1
            np.multiply(grad, 1.0 - beta1, out=tmp)
            m += tmp
            v *= beta2
            np.multiply(grad, grad, out=tmp)
            tmp *= 1.0 - beta2
            v += tmp
            np.sqrt(v, out=tmp)
            tmp *= inv_v_correction
            tmp += ADAM_EPS
            np.divide(m, tmp, out=tmp)
            tmp *= step_size
            work[name] -= tmp
