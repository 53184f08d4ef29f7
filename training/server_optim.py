"""What the coordinator does with a round's deltas: average them, then apply the average.

Applying the average through an optimizer is FedOpt (Reddi et al., "Adaptive Federated
Optimization", 2021): the negated average delta is treated as a pseudo-gradient of the
global weights. ``avg`` with lr 1 is plain delta averaging (FedAvg, the assignment);
``momentum`` is FedAvgM; ``adam`` is FedAdam; ``nesterov`` is DiLoCo's outer step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from thrift_trainer.training.aggregation import weighted_mean
from thrift_trainer.training.lr_schedule import Schedule

Params = dict[str, np.ndarray]


def weighted_average(deltas: Sequence[Mapping[str, np.ndarray]], counts: Sequence[int]) -> Params:
    """Average the nodes' deltas weighted by their sample counts (FedAvg's weighting), as
    the `mean` aggregation rule does, after checking that they can be averaged."""
    if not deltas or len(deltas) != len(counts):
        raise ValueError(f"need one count per delta: {len(deltas)} deltas, {len(counts)} counts")
    if any(count <= 0 for count in counts):
        raise ValueError(f"sample counts must be positive, got {list(counts)}")
    names = set(deltas[0])
    for delta in deltas[1:]:
        if set(delta) != names:
            raise ValueError(f"deltas disagree on names: {sorted(names)} vs {sorted(delta)}")
    return weighted_mean(deltas, counts)


class ServerOptimizer:
    """Turns the averaged delta into new global weights; subclasses add state.

    ``step`` returns new arrays and never mutates its inputs, so the coordinator can keep the
    previous weights (for a checkpoint or a retry) without copying them first.
    """

    name = ""
    slots: tuple[str, ...] = ()  # per-parameter state arrays, e.g. ("m", "v") for Adam
    defaults: Mapping[str, float] = {}

    def __init__(self, **hyper: float) -> None:
        unknown = sorted(set(hyper) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"server optimizer {self.name!r}: unknown option(s) {unknown}; "
                f"known: {sorted(self.defaults)}"
            )
        self.hyper = {key: float(hyper.get(key, value)) for key, value in self.defaults.items()}
        for key, value in self.hyper.items():
            upper = 1.0 if key.startswith("beta") else math.inf  # a beta of 1 never forgets
            if not 0.0 <= value < upper:
                raise ValueError(
                    f"server optimizer {self.name!r}: {key} must be in [0, {upper}), got {value}"
                )
        self.steps = 0
        self.state: dict[str, Params] = {slot: {} for slot in self.slots}
        # run.server_lr_schedule: the update of step k is scaled by its factor (for avg,
        # the averaged delta; otherwise the same as scaling the rate); None: unscaled
        self.schedule: Schedule | None = None

    def config(self) -> dict[str, Any]:
        """Name and hyperparameters: enough to rebuild it with :func:`make_server_optimizer`."""
        return {"name": self.name, **self.hyper}

    def step(
        self, weights: Mapping[str, np.ndarray], avg_delta: Mapping[str, np.ndarray]
    ) -> Params:
        """New weights after one round."""
        if set(weights) != set(avg_delta):
            raise ValueError(f"weights {sorted(weights)} and delta {sorted(avg_delta)} differ")
        self.steps += 1
        if self.schedule is not None and not self.schedule.is_constant:
            factor = self.schedule.factor(self.steps - 1)
            return {name: np.asarray(weights[name], dtype=np.float64)
                    + factor * self._update(name, avg_delta[name]) for name in weights}
        return {
            name: np.asarray(weights[name], dtype=np.float64) + self._update(name, avg_delta[name])
            for name in weights
        }

    def _update(self, name: str, delta: np.ndarray) -> np.ndarray:
        """The change to apply to parameter ``name``; overridden by each optimizer."""
        raise NotImplementedError

    def _slot(self, slot: str, name: str, like: np.ndarray) -> np.ndarray:
        """State array ``slot`` of parameter ``name``, zero on first use."""
        return self.state[slot].setdefault(name, np.zeros_like(like, dtype=np.float64))

    def state_dict(self) -> dict[str, Any]:
        """Flat, ``np.savez``-friendly state: name, step count, and ``"<slot>.<param>"`` arrays."""
        state: dict[str, Any] = {"name": self.name, "step": self.steps}
        for slot, arrays in self.state.items():
            state.update({f"{slot}.{name}": array.copy() for name, array in arrays.items()})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` produced (possibly after an np.savez round trip)."""
        if str(state.get("name")) != self.name:
            raise ValueError(f"state is for {state.get('name')!r}, not {self.name!r}")
        slots: dict[str, Params] = {slot: {} for slot in self.slots}
        for key, value in state.items():
            if key in ("name", "step"):
                continue
            slot, _, name = key.partition(".")
            if slot not in slots or not name:
                raise ValueError(f"unexpected key {key!r} in {self.name!r} optimizer state")
            slots[slot][name] = np.array(value, dtype=np.float64)
        self.steps = int(state["step"])
        self.state = slots


class AvgServer(ServerOptimizer):
    """weights += lr * avg_delta; lr 1 is the assignment's delta averaging."""

    name = "avg"
    defaults = {"lr": 1.0}

    def _update(self, name: str, delta: np.ndarray) -> np.ndarray:
        return self.hyper["lr"] * np.asarray(delta, dtype=np.float64)


class MomentumServer(ServerOptimizer):
    """FedAvgM: m = beta * m + avg_delta; weights += lr * m.

    Successive rounds' deltas point roughly the same way, so momentum lengthens the step by
    up to 1 / (1 - beta) without making any single node's local training more aggressive.
    """

    name = "momentum"
    slots = ("m",)
    defaults = {"lr": 1.0, "beta": 0.9}

    def _update(self, name: str, delta: np.ndarray) -> np.ndarray:
        m = self._slot("m", name, delta)
        m *= self.hyper["beta"]
        m += delta
        return self.hyper["lr"] * m


class AdamServer(ServerOptimizer):
    """FedAdam with bias correction, on the pseudo-gradient g = -avg_delta.

    The defaults follow Reddi et al.: beta2 0.99 and a large eps (their tau, 1e-3) so that
    coordinates whose deltas are tiny are not blown up to full lr-sized steps.
    """

    name = "adam"
    slots = ("m", "v")
    defaults = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3}

    def _update(self, name: str, delta: np.ndarray) -> np.ndarray:
        beta1, beta2 = self.hyper["beta1"], self.hyper["beta2"]
        grad = -np.asarray(delta, dtype=np.float64)
        m, v = self._slot("m", name, grad), self._slot("v", name, grad)
        m *= beta1
        m += (1.0 - beta1) * grad
        v *= beta2
        v += (1.0 - beta2) * grad * grad
        m_hat = m / (1.0 - beta1**self.steps)
        v_hat = v / (1.0 - beta2**self.steps)
        return -self.hyper["lr"] * m_hat / (np.sqrt(v_hat) + self.hyper["eps"])


class NesterovServer(ServerOptimizer):
    """SGD with Nesterov momentum on the pseudo-gradient g = -avg_delta, as torch's SGD
    computes it: m = beta * m + avg_delta; weights += lr * (avg_delta + beta * m). DiLoCo's
    outer optimizer (Douillard et al., 2023: lr 0.7, beta 0.9)."""

    name = "nesterov"
    slots = ("m",)
    defaults = {"lr": 0.7, "beta": 0.9}

    def _update(self, name: str, delta: np.ndarray) -> np.ndarray:
        delta = np.asarray(delta, dtype=np.float64)
        m = self._slot("m", name, delta)
        m *= self.hyper["beta"]
        m += delta
        return self.hyper["lr"] * (delta + self.hyper["beta"] * m)


SERVER_OPTIMIZERS: dict[str, type[ServerOptimizer]] = {
    cls.name: cls for cls in (AvgServer, MomentumServer, AdamServer, NesterovServer)
}


def make_server_optimizer(name: str = "avg", **hyper: float) -> ServerOptimizer:
    """Build a server optimizer by name, e.g. ``make_server_optimizer("adam", lr=3e-3)``."""
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"unknown server optimizer {name!r}; known: {sorted(SERVER_OPTIMIZERS)}")
    return SERVER_OPTIMIZERS[name](**hyper)
