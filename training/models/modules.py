"""Any torch ``nn.Module`` as a trainable model: built from its name, seen as named arrays.

`run.model` names a built-in torch model (`BUILT_IN`) or a plug-in (``module:attribute``,
training/plugins.py): an ``nn.Module`` class or a factory returning one, called with
`run.model_args`. Arguments named ``in_features``, ``num_classes`` or ``input_shape`` that
the configuration leaves out are filled from the data set (`DataShape`), so a stock
classifier needs no arguments at all.

On the wire a model is its ``state_dict``: every parameter and buffer under its own name,
so a saved model loads into the user's module with ``load_state_dict(strict=True)``.
Nodes prove they build the same model with `fingerprint` (names, shapes and dtypes).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from thrift_trainer.training import plugins
from thrift_trainer.training.models.settings import DataShape
from thrift_trainer.training.plugins import PluginError

Weights = dict[str, np.ndarray]
DATA_ARGUMENTS = ("in_features", "num_classes", "input_shape")
# dtypes whose tensors numpy can view (not bfloat16, say)
NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8,
                           torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})


def mlp_classifier(in_features: int, num_classes: int, hidden: list[int] | None = None,
                   dropout: float = 0.0) -> nn.Module:
    """A ReLU perceptron over the flattened input: hidden layers of the given widths."""
    widths = [in_features, *(hidden if hidden is not None else [64])]
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(widths[-1], num_classes))
    return nn.Sequential(*layers)


BUILT_IN: dict[str, Callable[..., nn.Module]] = {"mlp_classifier": mlp_classifier}


def factory_of(name: str) -> Callable[..., Any]:
    """The class or function that builds model ``name``; PluginError if there is none."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    factory = plugins.resolve(name, "model")
    if not callable(factory):
        raise PluginError(f"model {name} is not an nn.Module class or a function returning "
                          f"one (it is a {type(factory).__name__})")
    return factory


def build(name: str, args: Mapping[str, Any], shape: DataShape | None = None,
          seed: int | None = None) -> nn.Module:
    """Model ``name`` built with ``args`` (and what ``shape`` fills in), its parameters
    drawn from ``seed`` (torch's global generator is left as it was). PluginError names
    the model when it cannot be built."""
    factory = factory_of(name)
    kwargs = _arguments(name, factory, dict(args), shape)
    with _seeded(seed):
        try:
            module = factory(**kwargs)
        except Exception as exc:
            raise PluginError(f"model {name} could not be built with {_shown(kwargs)}: "
                              f"{type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise PluginError(f"model {name} is not an nn.Module: it gave a "
                          f"{type(module).__name__}")
    return module


def _arguments(name: str, factory: Callable[..., Any], args: dict[str, Any],
               shape: DataShape | None) -> dict[str, Any]:
    """``args`` checked against the factory's parameters, with the data's filled in."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass args as they are
        return args
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(set(args) - set(parameters)) if not takes_any else []
    if unknown:
        raise PluginError(f"run.model_args: model {name} takes no argument {unknown[0]!r} "
                          f"(it takes: {', '.join(parameters) or 'none'})")
    if shape is not None:
        known = {"in_features": shape.in_features, "num_classes": shape.num_classes,
                 "input_shape": list(shape.input_shape)}
        for key in DATA_ARGUMENTS:
            if key in parameters and key not in args and known[key] is not None:
                args[key] = known[key]
    return args


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _shown(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(kwargs, default=str) if kwargs else "no arguments"


# ------------------------------------------------------------------ weights
def state_arrays(module: nn.Module) -> Weights:
    """The module's state (parameters and buffers) as C-ordered numpy copies."""
    return {name: np.array(value.detach().cpu().numpy(), order="C", copy=True)
            for name, value in module.state_dict().items()}


def float32_copy(tensor: torch.Tensor) -> np.ndarray:
    """A float32 C-contiguous copy: a view would let a later optimizer step change an
    update that is still waiting to be sent."""
    return np.array(tensor.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)


def lendable(module: nn.Module, weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """``weights`` loaded for maths that only reads the module's parameters (a gradient):
    the parameters that can be their received arrays themselves, as tensors over that
    memory for `lent` (a CPU tensor of the same dtype, C-ordered, over a writable buffer,
    as a received message is: no copy of a big model); the others and the buffers copied
    in here (`load_arrays`, which checks every name and shape: ValueError)."""
    viewed = {name: torch.from_numpy(array) for name, param in module.named_parameters()
              if (array := _lendable(weights.get(name), param)) is not None}
    load_arrays(module, weights, skip=viewed.keys())
    return viewed


@contextlib.contextmanager
def lent(module: nn.Module, tensors: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """The module's parameters named in ``tensors`` are those tensors while the block
    runs; afterwards they get storage of their own again, unwritten (a pooled module is
    loaded before use), so that the module never keeps the memory lent."""
    params = dict(module.named_parameters())
    try:
        with torch.no_grad():
            for name, tensor in tensors.items():
                params[name].data = tensor
        yield
    finally:
        with torch.no_grad():
            for name in tensors:
                params[name].data = torch.empty_like(params[name].data)


def _lendable(value: Any, param: torch.Tensor) -> np.ndarray | None:
    """A writable view of ``value`` (a received read-only array) for ``param`` to use as
    its memory, or None when it cannot be one."""
    if not isinstance(value, np.ndarray) or param.device.type != "cpu" or \
            param.dtype not in NUMPY_DTYPES or value.shape != tuple(param.shape) or \
            value.dtype != param.detach().numpy().dtype or not value.flags.c_contiguous:
        return None
    view = value.view()
    try:
        view.flags.writeable = True  # torch cannot hold read-only memory; nothing writes
    except ValueError:  # memory that is read-only underneath (bytes): copied instead
        return None
    return view


def load_arrays(module: nn.Module, weights: Mapping[str, np.ndarray],
                skip: Collection[str] = ()) -> None:
    """Copy ``weights`` into the module's state (but the names in ``skip``, whose shapes
    are checked all the same); ValueError names what does not fit."""
    state = module.state_dict()
    if set(state) != set(weights):
        missing = sorted(set(state) - set(weights))[:3]
        unexpected = sorted(set(weights) - set(state))[:3]
        raise ValueError(f"weights do not fit the model: missing {missing}, "
                         f"unexpected {unexpected}")
    for name, target in state.items():
        value = np.asarray(weights[name])
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"tensor {name!r} has shape {value.shape}, the model "
                             f"needs {tuple(target.shape)}")
        if name not in skip:
            copy_into(target, value)


def copy_into(target: torch.Tensor, value: np.ndarray) -> None:
    """Copy ``value`` into ``target`` in place, converting its dtype as it goes (rounding
    to nearest, as torch does). A tensor in memory takes it with no intermediate copy,
    read-only arrays too (the tensors a node receives are views of the message): a model
    of a gigabyte is not copied twice to be loaded."""
    if target.device.type == "cpu" and target.dtype in NUMPY_DTYPES:
        target.detach().numpy()[...] = value
        return
    array = np.asarray(value)  # torch cannot view read-only memory: copy that first
    with torch.no_grad():
        target.copy_(torch.from_numpy(array if array.flags.writeable else array.copy()))


def parameter_names(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_parameters()]


def buffer_names(module: nn.Module) -> list[str]:
    """Buffers in the state (BatchNorm's running statistics and batch count)."""
    params = set(parameter_names(module))
    return [name for name in module.state_dict() if name not in params]


def fingerprint_of(name: str, args: Mapping[str, Any], shape: DataShape | None = None) -> str:
    """The `fingerprint` of model ``name``, built on torch's meta device: shapes and dtypes
    without memory or initialisation (seconds and a gigabyte for a big model). A model
    that cannot be built there is built for real."""
    try:
        with torch.device("meta"):
            module = build(name, args, shape)
    except PluginError:
        module = build(name, args, shape)  # its own error, if it has one
    return fingerprint(module)


def fingerprint(module: nn.Module) -> str:
    """A short hash of the state's names, shapes and dtypes: equal on every process that
    builds the same model, whatever its weights."""
    described = [(name, list(value.shape), str(value.dtype))
                 for name, value in module.state_dict().items()]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def size_bytes(module: nn.Module) -> int:
    return sum(value.numel() * value.element_size() for value in module.state_dict().values())
