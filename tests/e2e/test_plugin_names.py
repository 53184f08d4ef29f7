"""What a run may name of a plug-in, through real processes started as docs/plugins.md
shows (``--plugins resnet_cnn``, the CNN example): only a model, data set, ... that the
allowed module defines itself. A name reaching through the module to what it imported
(``resnet_cnn:torch.os.system``, ``own_models:system`` after ``from os import system``), a
builtin, a private name or a dotted path is refused with one line naming the plug-in and
what the module allows, and its ``*_args`` reach nothing: the command they carry is never
run, by the coordinator, a node or a relay (asked directly by a peer from 127.0.0.2)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import local_cluster as procs
from devtools.local_cluster import REPO
from tests.conftest import Cluster
from tests.hostile import AttackerClient
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, ttypes

CNN = REPO / "examples" / "cnn"
REFUSED = 2  # the client's exit status for a request the coordinator refuses
PLUGINS = ("--plugins", "resnet_cnn,own_models")
# A plug-in module that imports what a hostile run would like to reach through it.
OWN_MODELS = '''
import os
import subprocess
from builtins import open
from os import system
from subprocess import run

from torch import nn
from torch.nn import Linear


class Net(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))

    def forward(self, x):
        return self.layers(x)
'''
CNN_ALLOWS = "(ResidualBlock, ResNetCNN)"
# (run.model, its model_args given the file a command would create, the module's models)
HOSTILE_MODELS = [
    ("resnet_cnn:torch.os.system", lambda f: {"command": f"id > {f}"}, CNN_ALLOWS),
    ("resnet_cnn:torch.save", lambda f: {"obj": 1, "f": str(f)}, CNN_ALLOWS),
    ("resnet_cnn:F.torch.os.system", lambda f: {"command": f"id > {f}"}, CNN_ALLOWS),
    ("own_models:os.system", lambda f: {"command": f"id > {f}"}, "(Net)"),
    ("own_models:system", lambda f: {"command": f"id > {f}"}, "(Net)"),
    ("own_models:run", lambda f: {"args": f"id > {f}", "shell": True}, "(Net)"),
    ("own_models:open", lambda f: {"file": str(f), "mode": "w"}, "(Net)"),
    ("own_models:Linear", lambda f: {"in_features": 784, "out_features": 10}, "(Net)"),
    ("resnet_cnn:nn.Conv2d", lambda f: {"in_channels": 1, "out_channels": 1,
                                        "kernel_size": 1}, CNN_ALLOWS),
    ("resnet_cnn:print", lambda f: {}, CNN_ALLOWS),
    ("resnet_cnn:__builtins__", lambda f: {}, CNN_ALLOWS),
    ("resnet_cnn:torch", lambda f: {}, CNN_ALLOWS),
]
IDS = ["torch-os-system", "torch-save", "functional-torch-os", "os-system", "imported-system",
       "imported-subprocess-run", "imported-builtin-open", "imported-nn-class",
       "dotted-nn-class", "builtin-print", "dunder-builtins", "imported-module"]


def sets(**settings: object) -> list[str]:
    return [a for key, value in settings.items()
            for a in ("--set", f"{key.replace('__', '.')}={json.dumps(value)}")]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list]]:
    """A coordinator over one node, and a relay over another, all allowing the CNN example's
    module (the very file of examples/cnn) and own_models."""
    workdir = tmp_path_factory.mktemp("plugin-names")
    shutil.copy(CNN / "resnet_cnn.py", workdir)
    (workdir / "own_models.py").write_text(OWN_MODELS)
    cluster = Cluster(workdir)
    relayed: list[procs.Proc] = []  # the relay's member, then the relay
    try:
        cluster.add_node(0.0, *PLUGINS)
        cluster.start_coordinator(2, *PLUGINS)
        relayed.append(procs.start_node(workdir, "member", 0.0, *PLUGINS))
        members = procs.write_nodes_file(workdir / "members.txt", relayed)
        relayed.append(procs.start_node(workdir, "relay", 0.0, "--relay", str(members),
                                        *PLUGINS))
        yield cluster, relayed
    finally:
        cluster.stop()
        for proc in reversed(relayed):
            proc.stop()


def assert_refused_in_one_line(cluster: Cluster, done, process: str, kind: str, name: str,
                               allows: str) -> None:
    output = done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == REFUSED, output
    assert len(lines) == 1, output
    module = name.partition(":")[0]
    assert f"{process} refuses {kind} {name}: a run may name only a" in lines[0], output
    assert f"{module} defines itself {allows}" in lines[0], output
    assert "Traceback" not in output + cluster.logs()


@pytest.mark.parametrize(("model", "args", "allows"), HOSTILE_MODELS, ids=IDS)
def test_a_run_naming_what_the_plugin_did_not_define_as_its_model_is_refused_and_runs_nothing(
        serving, tmp_path: Path, model, args, allows) -> None:
    cluster, _ = serving
    created = tmp_path / "created-by-the-run"
    done = cluster.client("--config", str(CNN / "run.yaml"), "--run-id", "hostile",
                          *sets(run__model=model, run__model_args=args(created),
                                run__rounds=1), timeout=180)
    assert not created.exists(), f"{model} ran: {created.read_bytes()[:80]!r}"
    assert_refused_in_one_line(cluster, done, "coordinator", "model", model, allows)
    assert cluster.coordinator.alive() and cluster.nodes[0].alive(), cluster.logs()


def test_a_data_set_reached_through_the_plugin_is_refused_and_runs_nothing(
        serving, tmp_path: Path) -> None:
    cluster, _ = serving
    created = tmp_path / "created-by-the-data-set"
    done = cluster.client("--config", str(CNN / "run.yaml"), "--run-id", "hostile-data",
                          *sets(run__dataset="resnet_cnn:torch.os.system", run__rounds=1,
                                data__args={"command": f"id > {created}"}), timeout=180)
    assert not created.exists(), f"the data set ran: {created.read_bytes()[:80]!r}"
    assert_refused_in_one_line(cluster, done, "coordinator", "data set",
                               "resnet_cnn:torch.os.system", CNN_ALLOWS)


@pytest.mark.parametrize("target", ["node", "relay"])
def test_a_peer_asking_a_node_or_relay_to_check_such_a_run_runs_nothing(
        serving, tmp_path: Path, target: str) -> None:
    """A peer need not go through the coordinator: it asks the node (or relay) itself
    whether it can serve a run naming os.system with a command."""
    _, (member, relay) = serving
    created = tmp_path / f"created-on-the-{target}"
    request = ttypes.RunCheckRequest(
        protocol_version=PROTOCOL_VERSION, run_id="hostile-check", algorithm="sync_sgd",
        model="resnet_cnn:torch.os.system", dataset="mnist",
        config_json=json.dumps({"model": {"args": {"command": f"id > {created}"}}}))
    with AttackerClient(ComputeNode, (member if target == "node" else relay).port) as peer:
        answer = peer.check_run(request)
    assert not created.exists(), f"the {target} ran the command: {created.read_bytes()[:80]!r}"
    assert not answer.ok
    assert f"{target} refuses model resnet_cnn:torch.os.system: a run may name only a model " \
           f"resnet_cnn defines itself {CNN_ALLOWS}; not a dotted path" in answer.problem, \
        answer.problem
