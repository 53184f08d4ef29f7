"""Which model names are torch models of training/models/modules.py, known without torch.

The letters MLP trains in numpy and its nodes never load torch, so the algorithms decide
which path a model takes from its name alone: a built-in torch model, or a plug-in
(``module:attribute``).
"""

from __future__ import annotations

from thrift_trainer.training import plugins

BUILT_IN_TORCH_MODELS = ("mlp_classifier",)  # training/models/modules.py's BUILT_IN
GAN_MODELS = ("dcgan28", "dcgan28-wide", "dcgan28-tiny", "dcgan64", "dcgan64-tiny", "mlpgan28",
              "mlpgan28-tiny")  # training/models/gan_models.py's GAN_MODELS
BUILT_IN_MODELS = ("mlp", *GAN_MODELS, *BUILT_IN_TORCH_MODELS)
NAME_LIMIT = 64  # characters of a model's (or an algorithm's) name
GRAD = "grad."  # a gradient in an update: grad.<parameter>
BUFFER = "buffer."  # a buffer's state in an update: buffer.<buffer>


def check_model_name(name: str) -> None:
    """ValueError unless ``name`` is a built-in model or a plug-in name."""
    if name not in BUILT_IN_MODELS and not plugins.is_plugin_name(name):
        raise ValueError(f"unknown model {name!r}; known: {', '.join(BUILT_IN_MODELS)}, or "
                         "a plug-in module:attribute (e.g. my_models:SmallCNN)")


def is_module_model(name: str) -> bool:
    """Whether ``name`` is a torch model: built in (`BUILT_IN_TORCH_MODELS`) or a plug-in."""
    return name in BUILT_IN_TORCH_MODELS or plugins.is_plugin_name(name)
