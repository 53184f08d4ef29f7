"""Training batches as a node reads them for a torch model: augmented (data.augment),
transformed by a plug-in (data.transform) and read ahead (data.prefetch).

Augmentation draws from a generator seeded by the unit (run seed, round, unit), so a unit
computed again, on any node, sees the very same batches, and the next round other ones.
Only training batches are shaped so; evaluation reads examples as they are.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from torch.nn import functional as F

from thrift_trainer.training import plugins
from thrift_trainer.training.data.settings import DataSettings
from thrift_trainer.training.models.settings import DataShape
from thrift_trainer.training.plugins import PluginError

Batch = tuple[torch.Tensor, torch.Tensor]
Transform = Callable[[torch.Tensor, torch.Tensor, torch.Generator], Batch]


class Reader:
    """Reads a split's batches: ``take`` then the run's transforms, optionally ahead."""

    def __init__(self, settings: DataSettings, shape: DataShape) -> None:
        self.prefetch = settings.prefetch
        self.transforms: list[Transform] = []
        if settings.augment != "none":
            if len(shape.input_shape) != 3:
                raise ValueError(f"data.augment {settings.augment} flips and crops images of "
                                 f"shape (channels, height, width); these examples have "
                                 f"shape {shape.input_shape}")
            self.transforms.append(_augment(settings.augment, settings.crop_padding))
        if settings.transform:
            self.transforms.append(_plugin(settings.transform))

    @property
    def shapes(self) -> bool:
        """Whether batches are changed on their way (augmented or transformed)."""
        return bool(self.transforms)

    def batches(self, take: Callable[[np.ndarray], Batch], order: Iterable[np.ndarray],
                seed: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """(indices, inputs, targets) of each batch of ``order``, in order."""
        generator = torch.Generator().manual_seed(seed)

        def read(indices: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
            inputs, targets = take(indices)
            for transform in self.transforms:
                inputs, targets = transform(inputs, targets, generator)
            return indices, inputs, targets

        plain = (read(indices) for indices in order)
        return _ahead(plain, self.prefetch) if self.prefetch else plain


PLAIN = Reader(DataSettings(), DataShape((1,), None))  # take() alone


# ------------------------------------------------------------------ augmentation
def _augment(kind: str, padding: int) -> Transform:
    def augment(inputs: torch.Tensor, targets: torch.Tensor,
                generator: torch.Generator) -> Batch:
        if "crop" in kind and padding:
            inputs = random_crop(inputs, padding, generator)
        if "flip" in kind:
            inputs = random_flip(inputs, generator)
        return inputs, targets
    return augment


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image of (n, C, H, W) mirrored left to right with probability 1/2."""
    flipped = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flipped.view(-1, 1, 1, 1), images.flip(-1), images)


def random_crop(images: torch.Tensor, padding: int,
                generator: torch.Generator) -> torch.Tensor:
    """Each image of (n, C, H, W) padded with ``padding`` zeros on every side and cropped
    back to H x W at a random offset."""
    height, width = images.shape[-2:]
    padded = F.pad(images, (padding, padding, padding, padding))
    offsets = torch.randint(0, 2 * padding + 1, (len(images), 2), generator=generator)
    return torch.stack([padded[i, :, y:y + height, x:x + width]
                        for i, (y, x) in enumerate(offsets.tolist())])


# ------------------------------------------------------------------ plug-in transforms
def _plugin(name: str) -> Transform:
    function = plugins.resolve(name, "transform")

    def transform(inputs: torch.Tensor, targets: torch.Tensor,
                  generator: torch.Generator) -> Batch:
        try:
            result = function(inputs, targets, generator)
        except Exception as exc:
            raise PluginError(f"transform {name} failed: {type(exc).__name__}: {exc}") \
                from None
        if not (isinstance(result, tuple) and len(result) == 2 and
                all(isinstance(part, torch.Tensor) for part in result) and
                len(result[0]) == len(result[1]) == len(inputs)):
            raise PluginError(f"transform {name} must return (inputs, targets), tensors of "
                              f"the batch's {len(inputs)} examples")
        return result
    return transform


# ------------------------------------------------------------------ reading ahead
_DONE = object()


def _ahead(items: Iterator, depth: int) -> Iterator:
    """``items`` computed in a thread up to ``depth`` ahead of the consumer; an error
    there is raised here, in order; a consumer that stops early stops the thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple) -> bool:
        """Whether ``entry`` was queued before the consumer stopped."""
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_DONE, None))
        except BaseException as exc:  # handed to the consumer, which raises it
            put((_DONE, exc))

    thread = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
