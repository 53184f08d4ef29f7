"""Can this process serve a run? Its plug-ins, and what it builds of the run's model and data.

Before round 1 the coordinator computes `RunFacts` of the run and asks every pushed node
for its own (`ComputeNode.check_run`); with every unit, the coordinator's fingerprints
travel in the request's config (``expect``), so a pull node or a relay's member that was
not asked checks itself on its first unit. A process that lacks a plug-in, runs another
version of a plug-in the run names (a module's version, or a hash of its source file: an
edited `forward()` changes no parameter fingerprint, yet would train other maths), builds
another model or holds another copy of the data set is unfit for the run: `unfit_reason`
says why in one line, and the node is left out of the run (never a traceback or a hang).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

from thrift_trainer.training import plugins
from thrift_trainer.training.algorithms import get_algorithm
from thrift_trainer.training.data.paths import folder_stamp
from thrift_trainer.training.models.names import is_module_model
from thrift_trainer.training.spec import RunSpec

PLUGIN_KINDS = {"algorithm": "algorithm", "model": "model", "dataset": "data set"}
UNNAMED = ""  # a node-resident data set that is one client, named by its node's id


class RunUnfit(ValueError):
    """This process cannot serve the run; the message says why in one line."""


@dataclass(frozen=True)
class RunFacts:
    """What one process makes of a run."""

    plugins: dict[str, str] = field(default_factory=dict)  # allowed module -> version
    model_fingerprint: str = ""  # a torch model's state names, shapes and dtypes
    data_fingerprint: str = ""  # its copy of the data set
    data_size: int = 0  # examples of the training part
    partition: str = ""  # fingerprint of its partition of the data set into the run's clients
    # The clients a node holds, when only some (compute_node.py --clients); None: every one.
    clients: tuple[str, ...] | None = None
    # Node-resident clients (placement nodes): this process's own clients by name (UNNAMED
    # for a data set that is one client: its node names it by its id), each one's training
    # examples, label counts (None: its operator keeps them private) and a fingerprint of
    # its data (two nodes may hold a client of one name only with the same data).
    own_sizes: dict[str, int] = field(default_factory=dict)
    own_labels: dict[str, dict[int, int] | None] = field(default_factory=dict)
    own_fingerprints: dict[str, str] = field(default_factory=dict)

    def expectation(self) -> dict[str, object]:
        """What units carry for nodes to check themselves against (config's ``expect``)."""
        expected: dict[str, object] = {"plugins": dict(self.plugins)} if self.plugins else {}
        if not self.model_fingerprint:
            return expected
        expected.update({"model": self.model_fingerprint, "data": self.data_fingerprint,
                         "size": self.data_size})
        if self.partition:
            expected["partition"] = self.partition
        return expected


def run_facts(spec: RunSpec, location: Path) -> RunFacts:
    """This process's facts of the run; RunUnfit when it cannot serve it (a plug-in it
    lacks or that fails, a data set it cannot read)."""
    # The folder's stamp is part of the cache's key: a copy of the data set fixed or
    # replaced while the process runs is fingerprinted (and counted) again.
    return _facts(spec.to_config_json(), spec.algorithm, spec.model, spec.dataset,
                  str(location), folder_stamp(location))


@functools.lru_cache(maxsize=8)
def _facts(config_json: str, algorithm: str, model: str, dataset: str,
           location: str, stamp: tuple) -> RunFacts:
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
        facts = RunFacts(plugins.versions(), setup.fingerprint(), setup.data.fingerprint,
                         len(setup.data.train), _partition(setup, spec, config))
        return replace(facts, **_own_clients(setup, spec, config)) if spec.clients.on_nodes \
            else facts
    except (plugins.PluginError, ValueError) as exc:  # ConfigError and DataError too
        text = str(exc)
        raise RunUnfit(text if text.startswith("lacks ") else
                       f"cannot serve the run: {text}") from None


def _other_plugin_version(expected: object, found: dict[str, str],
                          spec: RunSpec) -> str | None:
    """Why a process that runs another version of a plug-in module the run names is unfit,
    or None. (Modules the run does not name are left alone: a node may allow more.)"""
    if not isinstance(expected, dict):
        return None
    for _, name in spec.named_plugins:
        module = name.partition(plugins.SEPARATOR)[0]
        want, have = expected.get(module), found.get(module)
        if want is not None and have is not None and want != have:
            return (f"runs another version of plug-in {module} ({have}, the coordinator's "
                    f"{want}): give every process the same file or package, and restart "
                    f"the ones that run the old one")
    return None


def _partition(setup: object, spec: RunSpec, config: dict) -> str:
    """The fingerprint of this process's partition into the run's clients ("" without, and
    for node-resident clients, which are no partition of a shared data set)."""
    if not spec.clients.enabled or spec.clients.on_nodes:
        return ""
    from thrift_trainer.training.clients.data_parts import parts_of

    return parts_of(setup, spec.clients, config["seed"])[1].fingerprint


def _own_clients(setup: object, spec: RunSpec, config: dict) -> dict[str, dict]:
    """Node-resident clients: each of this process's own clients' training examples, label
    counts and data fingerprint, by name (UNNAMED for a data set that is one client)."""
    import numpy as np

    from thrift_trainer.training.clients.data_parts import (
        own_clients,
        own_examples,
        training_labels,
    )

    named = own_clients(setup)
    prints = {key: parts.fingerprint for key, parts in named.items()} if named \
        else {UNNAMED: setup.data.fingerprint}
    labels = training_labels(setup)
    sizes, counts = {}, {}
    for key in prints:
        own = own_examples(spec.clients, config["seed"], key or None)(setup)
        kinds, n = np.unique(labels[own], return_counts=True)
        sizes[key] = len(own)
        counts[key] = {int(k): int(c) for k, c in zip(kinds, n, strict=True)}
    return {"own_sizes": sizes, "own_labels": counts, "own_fingerprints": prints}


def unfit_reason(expected: RunFacts | dict, found: RunFacts, spec: RunSpec) -> str | None:
    """Why a process whose facts are ``found`` cannot serve a run whose coordinator has
    ``expected`` (facts, or a unit's ``expect``), or None when it can."""
    if isinstance(expected, RunFacts):
        expected = expected.expectation()
    if not expected:
        return None
    if "model" in expected and expected["model"] != found.model_fingerprint:
        return (f"builds model {spec.model} with other parameters (names, shapes or dtypes "
                f"differ: fingerprint {found.model_fingerprint}, the coordinator's "
                f"{expected.get('model')}); is it the same version of the plug-in?")
    other = _other_plugin_version(expected.get("plugins"), found.plugins, spec)
    if other is not None or "model" not in expected:  # without a torch model, that is all
        return other
    if spec.clients.on_nodes:  # each node's own data: different files are expected
        return None
    if expected.get("size") != found.data_size:
        return (f"holds another copy of data set {spec.dataset}: {found.data_size} training "
                f"examples, the coordinator's {expected.get('size')}")
    if expected.get("data") != found.data_fingerprint:
        return (f"holds another copy of data set {spec.dataset}: its files differ from the "
                f"coordinator's (fingerprint {found.data_fingerprint}, the coordinator's "
                f"{expected.get('data')})")
    if expected.get("partition", "") != found.partition:
        return (f"deals data set {spec.dataset} to the run's clients otherwise (partition "
                f"{found.partition or 'none'}, the coordinator's "
                f"{expected.get('partition') or 'none'}); is it the same version of the "
                f"partitioner?")
    return None
