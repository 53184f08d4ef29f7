"""SignSGD with error feedback: one bit per entry of each update, and one scale per tensor.

A node sends the sign of every entry, packed eight to a byte, and the tensor's mean
absolute value; the coordinator decodes ``scale * sign``. What that leaves out of an update
(its error) stays on the node and is added to its next update of the same unit slot, so
over the rounds all of it is sent (EF-SignSGD: Karimireddy et al., "Error Feedback Fixes
SignSGD and other Gradient Compression Schemes", ICML 2019). An update of float64 entries
travels in about 1/64 of its bytes, float32 in 1/32.

Error feedback suits updates that add up over rounds (deltas and gradients): the trainer
allows this codec where it allows ``topk``, under ``delta_avg`` and ``sync_sgd`` (not for
the GANs). A torch model's buffers (BatchNorm statistics) are states, not changes: they
travel whole.

Use it: start the coordinator and every node with ``--plugins signsgd`` and set::

    compression:
      up: signsgd:SignSGD
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

import thrift_trainer as tt

MAX_ELEMENTS = 1 << 27  # a shape from the network claiming more is refused before allocating


class SignSGD(tt.Codec):
    """Parts: ``signs`` (uint8, the packed sign bits, 1 for entries >= 0), ``scale`` (0-d,
    the tensor's dtype: its mean absolute value) and ``shape`` (int64 sizes). `decode`
    refuses malformed parts with ValueError: they come from the network."""

    name = "signsgd"
    error_feedback = True

    def encode(self, value: np.ndarray) -> dict[str, np.ndarray]:
        scale = np.asarray(np.abs(value).mean() if value.size else 0.0, dtype=value.dtype)
        return {"signs": np.packbits(value.reshape(-1) >= 0), "scale": scale,
                "shape": np.asarray(value.shape, dtype=np.int64)}

    def decoded_shape(self, name: str, parts: Mapping[str, np.ndarray]) -> tuple[int, ...]:
        """The shape the parts claim (checked before anything is decoded)."""
        if set(parts) != {"signs", "scale", "shape"}:
            raise ValueError(f"tensor {name!r}: signsgd needs parts signs, scale and shape, "
                             f"got {sorted(parts)}")
        shape = parts["shape"]
        if shape.dtype != np.int64 or shape.ndim != 1 or np.any(shape < 0):
            raise ValueError(f"tensor {name!r}: signsgd shape must be non-negative int64 sizes")
        return tuple(int(n) for n in shape)

    def decode(self, name: str, parts: Mapping[str, np.ndarray]) -> np.ndarray:
        shape = self.decoded_shape(name, parts)
        signs, scale = parts["signs"], parts["scale"]
        size = math.prod(shape)
        if size > MAX_ELEMENTS:
            raise ValueError(f"tensor {name!r}: signsgd shape {list(shape)} is too large")
        if signs.dtype != np.uint8 or signs.shape != ((size + 7) // 8,):
            raise ValueError(f"tensor {name!r}: signsgd needs {(size + 7) // 8} packed bytes "
                             f"for {size} entries, got {signs.dtype} {signs.shape}")
        if scale.shape != () or scale.dtype not in (np.float32, np.float64) \
                or not np.isfinite(scale) or scale < 0:
            raise ValueError(f"tensor {name!r}: signsgd scale must be a finite 0-d float >= 0")
        bits = np.unpackbits(signs, count=size).astype(scale.dtype)
        return ((2 * bits - 1) * scale).reshape(shape)
