"""Warming a node up: load torch and build a model before the first unit needs them.

Why: a node that trains its first torch unit first imports torch and builds the model,
which takes seconds to tens of seconds on a loaded machine, and that time would land
in round 1. The coordinator asks for a warm-up in its pings before round 1 starts (or
`compute_node.py --warm-up MODEL` asks at start) and waits while nodes report it.

The work runs in a background thread, so the node answers pings (and reports that it
is warming up) meanwhile; it is best effort: a failure is logged and the unit that needs
the library meets the same problem with its own message.

Anyone who reaches the node's port may ping it, so a warm-up must name a model this node
could train (`warm_up_problem`: built in, or a plug-in of a module it allows, at most
NAME_LIMIT characters); anything else is refused with a log line that does not echo it.
What the node keeps of warm-ups is bounded by the built-in models: each GAN, and torch
alone for every other model (all the warm-up does for them).
"""

from __future__ import annotations

import logging
import threading
import time

from thrift_trainer.training import plugins
from thrift_trainer.training.models.names import GAN_MODELS, NAME_LIMIT, check_model_name

log = logging.getLogger("compute_node")
TORCH = "torch"  # what is warmed for a model other than a GAN: the library alone


def warm_up_problem(model: str) -> str | None:
    """Why this node will not warm up for `model`, or None when it can build it."""
    if len(model) > NAME_LIMIT:
        return f"a model name of {len(model):,} characters, longer than {NAME_LIMIT}"
    try:
        check_model_name(model)
        if plugins.is_plugin_name(model):
            plugins.resolve(model, "model")  # imports only a module the operator allowed
    except ValueError as exc:  # PluginError included
        return str(exc)
    return None


class WarmUp:
    """Warms each model once, one model at a time, in a daemon thread."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._lock = threading.Lock()
        self._asked: set[str] = set()  # GAN names and TORCH: at most len(GAN_MODELS) + 1
        self._threads: list[threading.Thread] = []  # the ones still running

    def start(self, model: str) -> str | None:
        """Warm `model` up in the background unless it was asked for before; returns why
        not when the node cannot build it (and does nothing)."""
        if not model:
            return None
        problem = warm_up_problem(model)
        if problem:
            return problem
        what = model if model in GAN_MODELS else TORCH
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            if what in self._asked:
                return None
            self._asked.add(what)
            thread = threading.Thread(target=self._warm, args=(what,),
                                      name=f"warm-up-{what}", daemon=True)
            self._threads.append(thread)
        thread.start()
        return None

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

    from thrift_trainer.training.models import gan_models

    if model not in gan_models.GAN_MODELS:
        return  # the MLP of sync_sgd needs only torch itself
    g, d = gan_models.build_gan(gan_models.gan_spec(model))
    g, d = g.to(device), d.to(device)
    z = torch.randn(2, g.z_dim, device=device)
    d(g(z)).sum().backward()
