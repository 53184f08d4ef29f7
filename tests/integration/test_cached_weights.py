"""Units that refer to weights a node kept, over Thrift to a real node process on
loopback: the second unit of a version goes without its weights and trains exactly as
the first; a node restarted in between answers NEED_WEIGHTS and the client sends the
weights again by itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devtools import local_cluster
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.thrift_client import ThriftNodeClient
from thrift_trainer.engine.tasks import Task, TaskResult, TaskStatus
from thrift_trainer.training.models import mlp

HOST = "127.0.0.1"
HIDDEN = 200  # weights of about 70 kB (float64), far more than the rest of a request
CONFIG = json.dumps({"epochs": 1, "eta": 0.0001, "hidden": [HIDDEN]})
WEIGHT_BYTES = sum(a.nbytes for a in mlp.init_params(mlp.MLPSpec(hidden=(HIDDEN,))).values())


def unit(weights: dict, attempt: int, round_index: int = 3) -> Task:
    return Task(run_id="cached", round=round_index, unit_id="u1", attempt=attempt,
                algorithm="delta_avg", model="mlp", dataset="letters",
                unit_path="train_letters1.txt", config_json=CONFIG, weights=weights,
                scheduling_policy=2)


def start_node(workdir: Path, name: str, port: int = 0) -> local_cluster.Proc:
    return local_cluster.start("compute_node.py", [str(port), "0.0", "--host", HOST,
                                                   "--log-level", "INFO"], workdir, name)


@pytest.fixture
def nodes(tmp_path: Path):
    started: list[local_cluster.Proc] = []
    yield lambda name, port=0: started.append(start_node(tmp_path, name, port)) or started[-1]
    for proc in started:
        proc.stop()


def train(client: ThriftNodeClient, task: Task) -> tuple[TaskResult, int]:
    """The result and the bytes the call sent down."""
    before = client.payload.totals()[0]
    result = client.train(task)
    assert result.status == TaskStatus.COMPLETED, result.message
    return result, client.payload.totals()[0] - before


def same_update(a: TaskResult, b: TaskResult) -> bool:
    return a.update.keys() == b.update.keys() and all(
        np.array_equal(a.update[k], b.update[k]) for k in a.update)


def test_a_second_unit_refers_to_the_weights_and_a_restarted_node_gets_them_again(nodes):
    node = nodes("n1")
    client = ThriftNodeClient(NodeAddress(HOST, node.port), rpc_timeout=60.0,
                              connect_timeout=5.0)
    try:
        weights = mlp.init_params(mlp.MLPSpec(hidden=(HIDDEN,)), seed=5)
        first, full = train(client, unit(weights, attempt=1))
        assert full > WEIGHT_BYTES
        second, referred = train(client, unit(weights, attempt=2))
        assert referred < WEIGHT_BYTES / 20
        assert same_update(first, second)

        node.stop()  # restarted on its port: it holds nothing
        restarted = nodes("n1-restarted", node.port)
        third, resent = train(client, unit(weights, attempt=3))
        assert resent > WEIGHT_BYTES  # the reference, then the task again with its weights
        assert same_update(first, third)
        restarted.wait_for(r"weights of version 2 not held, asked for them", timeout=10.0)
        _, referred_again = train(client, unit(weights, attempt=4))
        assert referred_again < WEIGHT_BYTES / 20

        # Another dict under the same version (equal values here; MD-GAN's units each
        # carry their own) goes with its tensors, and from then on no unit of that
        # version is a reference: the node may hold either.
        _, another = train(client, unit(dict(weights), attempt=5))
        _, original = train(client, unit(weights, attempt=6))
        assert another > WEIGHT_BYTES and original > WEIGHT_BYTES
    finally:
        client.close()


def test_the_next_version_goes_with_its_weights_and_old_versions_are_dropped(nodes):
    node = nodes("n1")
    client = ThriftNodeClient(NodeAddress(HOST, node.port), rpc_timeout=60.0,
                              connect_timeout=5.0)
    try:
        rounds = {r: mlp.init_params(mlp.MLPSpec(hidden=(HIDDEN,)), seed=r) for r in (3, 4, 5)}
        for round_index, weights in rounds.items():
            _, sent = train(client, unit(weights, attempt=1, round_index=round_index))
            assert sent > WEIGHT_BYTES  # a new version is never a reference
        # The node keeps two versions of a run; the client refers to the newest one.
        _, referred = train(client, unit(rounds[5], attempt=2, round_index=5))
        assert referred < WEIGHT_BYTES / 20
        client.drop_sessions("cached")  # the run ended: the node forgets its weights
        node.wait_for(r"dropped 2 kept weight versions of run cached", timeout=10.0)
        _, after_drop = train(client, unit(rounds[5], attempt=3, round_index=5))
        assert after_drop > WEIGHT_BYTES
    finally:
        client.close()
