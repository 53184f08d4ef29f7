"""Can this process serve a run? Its plug-ins, and what it builds of the run's model and data.

Before round 1 the coordinator computes `RunFacts` of the run and asks every pushed node
for its own (`ComputeNode.check_run`); with every unit, the coordinator's fingerprints
travel in the request's config (``expect``), so a pull node or a relay's member that was
not asked checks itself on its first unit. A process that lacks a plug-in, builds
another model or holds another copy of the data set is unfit for the run: `unfit_reason`
says why in one line, and the node is left out of the run (never a traceback or a hang).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.models.names import is_module_model
from thrift_trainer.training.spec import RunSpec

PLUGIN_KINDS = {"algorithm": "algorithm", "model": "model", "dataset": "data set"}


class RunUnfit(ValueError):
    """This process cannot serve the run; the message says why in one line."""


@dataclass(frozen=True)
class RunFacts:
    """What one process makes of a run."""

    plugins: dict[str, str] = field(default_factory=dict)  # allowed module -> version
    model_fingerprint: str = ""  # a torch model's state names, shapes and dtypes
    data_fingerprint: str = ""  # its copy of the data set
    data_size: int = 0  # examples of the training part

    def expectation(self) -> dict[str, object]:
        """What units carry for nodes to check themselves against (config's ``expect``)."""
        if not self.model_fingerprint:
            return {}
        return {"model": self.model_fingerprint, "data": self.data_fingerprint,
                "size": self.data_size}


def run_facts(spec: RunSpec, location: Path) -> RunFacts:
    """This process's facts of the run; RunUnfit when it cannot serve it (a plug-in it
    lacks or that fails, a data set it cannot read)."""
    return _facts(spec.to_config_json(), spec.algorithm, spec.model, spec.dataset,
                  str(location))


@functools.lru_cache(maxsize=8)
def _facts(config_json: str, algorithm: str, model: str, dataset: str,
           location: str) -> RunFacts:
    spec = RunSpec.parse(algorithm, model, dataset, config_json)
    try:
        for kind, name in spec.named_plugins:  # each one usable here, or why it is not
            plugins.resolve(name, kind)
        cls = get_algorithm(spec.algorithm)
        config = cls.check_config(spec.model, spec.algorithm_config())
        if not is_module_model(spec.model):
            return RunFacts(plugins.versions())
        from thrift_trainer.training.algorithms import torch_model  # torch only for torch models

        setup = torch_model.setup_of(spec.model, config, spec.dataset, Path(location))
        return RunFacts(plugins.versions(), setup.fingerprint(), setup.data.fingerprint,
                        len(setup.data.train))
    except (plugins.PluginError, ValueError) as exc:  # ConfigError and DataError too
        text = str(exc)
        raise RunUnfit(text if text.startswith("lacks ") else
                       f"cannot serve the run: {text}") from None


def unfit_reason(expected: RunFacts | dict, found: RunFacts, spec: RunSpec) -> str | None:
    """Why a process whose facts are ``found`` cannot serve a run whose coordinator has
    ``expected`` (facts, or a unit's ``expect``), or None when it can."""
    if isinstance(expected, RunFacts):
        expected = expected.expectation()
    if not expected:
        return None
    if expected.get("model") != found.model_fingerprint:
        return (f"builds model {spec.model} with other parameters (names, shapes or dtypes "
                f"differ: fingerprint {found.model_fingerprint}, the coordinator's "
                f"{expected.get('model')}); is it the same version of the plug-in?")
    if expected.get("size") != found.data_size:
        return (f"holds another copy of data set {spec.dataset}: {found.data_size} training "
                f"examples, the coordinator's {expected.get('size')}")
    if expected.get("data") != found.data_fingerprint:
        return (f"holds another copy of data set {spec.dataset}: its files differ from the "
                f"coordinator's (fingerprint {found.data_fingerprint}, the coordinator's "
                f"{expected.get('data')})")
    return None
