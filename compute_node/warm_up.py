"""Warming a node up: load torch and build a model before the first unit needs them.

Why: a node that trains its first torch unit first imports torch and builds the model,
which takes seconds to tens of seconds on a loaded machine, and that time would land
in round 1. The coordinator asks for a warm-up in its pings before round 1 starts (or
`compute_node.py --warm-up MODEL` asks at start) and waits while nodes report it.

The work runs in a background thread, so the node answers pings (and reports that it
is warming up) meanwhile; it is best effort: a failure is logged and the unit that needs
the library meets the same problem with its own message.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("compute_node")


class WarmUp:
    """Warms each model once, one model at a time, in a daemon thread."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._lock = threading.Lock()
        self._asked: set[str] = set()
        self._threads: list[threading.Thread] = []

    def start(self, model: str) -> None:
        """Warm `model` up in the background unless it was asked for before."""
        with self._lock:
            if not model or model in self._asked:
                return
            self._asked.add(model)
            thread = threading.Thread(target=self._warm, args=(model,),
                                      name=f"warm-up-{model}", daemon=True)
            self._threads.append(thread)
        thread.start()

    @property
    def busy(self) -> bool:
        """Whether a warm-up is still running."""
        with self._lock:
            return any(t.is_alive() for t in self._threads)

    def _warm(self, model: str) -> None:
        began = time.monotonic()
        try:
            warm_model(model, self.device)
        except Exception as exc:  # noqa: BLE001 - best effort: the unit reports real errors
            log.warning("warm-up of %s failed: %s", model, exc)
            return
        log.info("warmed up for %s in %.1fs", model, time.monotonic() - began)


def warm_model(model: str, device: str = "cpu") -> None:
    """Import torch and, for a GAN, build the model and take one training step's
    forward and backward passes on two images, so the kernels are loaded too."""
    import torch

    from training.models import gan_models

    if model not in gan_models.GAN_MODELS:
        return  # the MLP of sync_sgd needs only torch itself
    g, d = gan_models.build_gan(gan_models.gan_spec(model))
    g, d = g.to(device), d.to(device)
    z = torch.randn(2, g.z_dim, device=device)
    d(g(z)).sum().backward()
