"""numpy arrays <-> the IDL's `Tensor` struct, without copying the payload.

A tensor travels as its dtype name, its shape and its C-order little-endian
bytes. `to_wire` hands Thrift a view of the array's own memory when the array
already has that layout, and `from_wire` wraps the received bytes with
`np.frombuffer`, so a large tensor is never copied by this module. Everything a
peer sends is validated first, because a wrong dtype or shape would otherwise
surface as a confusing numpy error far from the wire.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from thrift_trainer.wire.generated import ttypes

ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}
)

# numpy 1.26 (the oldest we support) handles at most 32 dimensions.
_MAX_DIMS = 32


class CodecError(ValueError):
    """A tensor cannot be encoded or decoded; the message says what to change."""


def to_wire(name: str, array: np.ndarray, copy_under: int = 0) -> ttypes.Tensor:
    """Wrap `array` as a Tensor whose `data` is a view of the array's memory.

    A C-contiguous little-endian array is not copied: the Tensor keeps a
    memoryview of it, so do not modify the array until the call that sends the
    Tensor has returned. Other layouts are converted once. An array of fewer than
    `copy_under` bytes is copied into `bytes`, which Thrift's C encoder takes as they are
    (see wire.c_codec): for Tensors sent many times, such as a round's weights.
    """
    arr = np.asarray(array)
    _check_dtype(name, arr.dtype.name)
    little = arr.dtype.newbyteorder("<")
    if arr.dtype != little:
        arr = arr.astype(little)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # not np.ascontiguousarray: it turns 0-d into 1-d
    data: memoryview | bytes = memoryview(arr.reshape(-1).view(np.uint8))
    if data.nbytes < copy_under:
        data = data.tobytes()
    return ttypes.Tensor(name=name, dtype=arr.dtype.name, shape=list(arr.shape), data=data)


def from_wire(t: ttypes.Tensor) -> np.ndarray:
    """Return a read-only array viewing `t.data` (no copy) after validating `t`.

    The array shares memory with the received message; copy it (`.copy()`)
    to modify it.
    """
    name = t.name if isinstance(t.name, str) else "<unnamed>"
    _check_dtype(name, t.dtype)
    shape = _checked_shape(name, t.shape)
    dtype = np.dtype(t.dtype).newbyteorder("<")
    if t.data is None:
        raise CodecError(f"tensor {name!r} has no data; the sender must set Tensor.data")
    have = memoryview(t.data).nbytes
    need = math.prod(shape) * dtype.itemsize
    if have != need:
        raise CodecError(
            f"tensor {name!r}: shape {shape} of {t.dtype} needs {need} bytes but data has "
            f"{have}; the sender must send exactly the C-order bytes of the declared shape"
        )
    arr = np.frombuffer(t.data, dtype=dtype).reshape(shape)
    arr.flags.writeable = False
    return arr


def dict_to_wire(d: Mapping[str, np.ndarray], copy_under: int = 0) -> list[ttypes.Tensor]:
    """Encode a name -> array mapping as a Tensor list, keeping its order (`copy_under`:
    as `to_wire` takes it)."""
    return [to_wire(name, array, copy_under) for name, array in d.items()]


def wire_to_dict(ts: Iterable[ttypes.Tensor]) -> dict[str, np.ndarray]:
    """Decode a Tensor list into a name -> array dict in list order.

    Duplicate names are refused: silently keeping one of them would drop data.
    """
    out: dict[str, np.ndarray] = {}
    for t in ts:
        if t.name in out:
            raise CodecError(
                f"tensor name {t.name!r} appears twice; every tensor in a list needs its own name"
            )
        out[t.name] = from_wire(t)
    return out


def specs_to_wire(specs: Mapping[str, tuple[tuple[int, ...], np.dtype]]) -> list[ttypes.Tensor]:
    """Tensors' names, shapes and dtypes (what an update must hold) as Tensors without data."""
    return [ttypes.Tensor(name=name, dtype=np.dtype(dtype).name, shape=[int(n) for n in shape],
                          data=b"") for name, (shape, dtype) in specs.items()]


def specs_from_wire(ts: Iterable[ttypes.Tensor]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The names, shapes and dtypes `specs_to_wire` sent, checked as tensors are."""
    specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for t in ts:
        name = t.name if isinstance(t.name, str) else "<unnamed>"
        if name in specs:
            raise CodecError(f"tensor name {name!r} appears twice in an update's form")
        _check_dtype(name, t.dtype)
        specs[name] = (_checked_shape(name, t.shape), np.dtype(t.dtype))
    return specs


def _check_dtype(name: str, dtype: object) -> None:
    if dtype not in ALLOWED_DTYPES:
        raise CodecError(
            f"tensor {name!r} has dtype {dtype!r}, which the wire does not carry; "
            f"convert it to one of {sorted(ALLOWED_DTYPES)} (e.g. .astype(np.float32))"
        )


def _checked_shape(name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or len(shape) > _MAX_DIMS:
        raise CodecError(
            f"tensor {name!r} has shape {shape!r}; it must be a list of at most "
            f"{_MAX_DIMS} non-negative integers"
        )
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise CodecError(
            f"tensor {name!r} has shape {list(shape)}; every dimension must be a "
            "non-negative integer"
        )
    return tuple(shape)
