"""Model files the torch ecosystem reads: safetensors out, and weights in from any of
safetensors, torch's .pt and this project's .npz.

``model.safetensors`` holds the model's state under its own names (a torch model's
``state_dict`` keys), so plain torch loads it into the user's module::

    from safetensors.torch import load_file
    module.load_state_dict(load_file("runs/<run>/model.safetensors"), strict=True)

Its metadata (strings, as the format wants) carries the run's model name, description,
configuration and plug-ins, so a file says how it was made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from thrift_trainer.training.outputs.model_file import (
    OPTIMIZER_PREFIX,
    ModelFileError,
    load_model,
    write_atomically,
)

SAFETENSORS_FILE = "model.safetensors"


def save_safetensors(path: str | os.PathLike, weights: Mapping[str, np.ndarray],
                     metadata: Mapping[str, Any]) -> Path:
    """Write atomically; ``metadata`` values that are not strings are stored as JSON.
    The file is written as the format lays it out (an 8-byte little-endian header size,
    the JSON header padded to 8 bytes, then each tensor's bytes in order) straight from
    the arrays: a big model is not copied into one buffer first (the library's ``save``
    holds two copies of it)."""
    # np.require, not np.ascontiguousarray, which turns a 0-d tensor (BatchNorm's
    # num_batches_tracked) into shape (1,), a shape the module then refuses
    tensors = {name: _little_endian(np.require(value, requirements="C"))
               for name, value in weights.items()}
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {key: value if isinstance(value, str) else json.dumps(value)
                                  for key, value in metadata.items()}
    offset = 0
    for name, value in tensors.items():
        header[name] = {"dtype": _dtype_name(name, value), "shape": list(value.shape),
                        "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)

    def write(f: BinaryIO) -> None:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for value in tensors.values():
            f.write(value.reshape(-1).view(np.uint8).data)
    return write_atomically(path, write)


_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
                       "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
                       "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}


def _dtype_name(name: str, value: np.ndarray) -> str:
    try:
        return _SAFETENSORS_DTYPES[value.dtype.name]
    except KeyError:
        raise ValueError(f"tensor {name!r}: safetensors has no dtype {value.dtype}") from None


def _little_endian(value: np.ndarray) -> np.ndarray:
    little = value.dtype.newbyteorder("<")
    return value if value.dtype == little else value.astype(little)


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and the metadata of a safetensors file; ModelFileError names the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())  # noqa: SIM118 (a safe_open handle is not iterable)
            return {name: f.get_tensor(name) for name in names}, dict(f.metadata() or {})
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} not found") from None
    except Exception as exc:  # the library raises its own error types for damaged files
        raise ModelFileError(f"{path} is not a readable safetensors file: {exc}") from None


def load_weights(path: str | os.PathLike, max_bytes: int | None = None
                 ) -> dict[str, np.ndarray]:
    """A model's weights from a .safetensors, .pt / .pth (a state dict, loaded with
    ``weights_only``) or .npz (this project's model or checkpoint: its optimizer state left
    unread, its arrays refused before they are read if they declare more than
    ``max_bytes``) file."""
    suffix = Path(path).suffix.lower()
    if suffix == ".safetensors":
        return read_safetensors(path)[0]
    if suffix in (".pt", ".pth"):
        return _torch_state(path)
    if suffix == ".npz":
        return load_model(path, max_bytes,
                          keep=lambda name: not name.startswith(OPTIMIZER_PREFIX))[0]
    raise ModelFileError(f"{path}: weights are read from .safetensors, .pt or .npz files")


def _torch_state(path: str | os.PathLike) -> dict[str, np.ndarray]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelFileError(f"model file {path} not found") from None
    except Exception as exc:
        raise ModelFileError(f"{path} is not a torch state dict file: {exc}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"],
                                                                         dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise ModelFileError(f"{path} does not hold a state dict (name -> tensor)")
    return {name: value.detach().cpu().numpy() for name, value in state.items()}
