"""Payloads that would decode to far more than they weigh, sent to real processes.

A topk part names the dense shape it fills: 3 MiB of entries, one per 4 KiB page of a
tensor claiming 2^27 float64 entries, would make its decoder touch 1 GiB. A result or a
work request whose tensors the run did not ask for (names, shapes, codec) is refused
before anything of it is decoded; the process's peak resident memory (VmHWM) says so.
Weights that do not fit the model are not kept in a node's weight cache, whose resident
memory (VmRSS) says so. Attackers call from 127.0.0.2 (tests/hostile.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from devtools.local_cluster import REPO
from tests.conftest import Cluster
from tests.hostile import AttackerClient, peak_bytes, resident_bytes
from tests.waiting import wait_until
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.tensor_codec import dict_to_wire, wire_to_dict

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

MIB = 1024 * 1024
BOMB_ELEMENTS = 1 << 27  # the most a topk part may claim: 1 GiB of float64
PAGE_ENTRIES = 512  # float64 entries per 4 KiB page: one set entry per page
PEAK_GROWTH_LIMIT = 256 * MIB
RUN = ["--config", str(REPO / "configs" / "letters_recommended.yaml"),
       "--set", "run.rounds=1", "--set", "delta_avg.epochs=1"]


def topk_bomb(name: str) -> dict[str, np.ndarray]:
    """The parts of a topk tensor `name` claiming BOMB_ELEMENTS entries, one set per page."""
    indices = np.arange(0, BOMB_ELEMENTS, PAGE_ENTRIES, dtype=np.int32)
    return {f"{name}#topk#values": np.ones(indices.size, dtype=np.float64),
            f"{name}#topk#indices": indices,
            f"{name}#topk#shape": np.asarray([BOMB_ELEMENTS], dtype=np.int64)}


def bombed_result(work: ttypes.WorkRequest) -> ttypes.TrainResult:
    """A completed result whose update holds the unit's tensors, the first a topk bomb."""
    first, *rest = wire_to_dict(work.weights).items()
    update = {**topk_bomb(first[0]), **{name: np.zeros_like(value) for name, value in rest}}
    return ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED,
                              update=dict_to_wire(update), num_samples=100, loss=0.5,
                              error=0.5, compute_seconds=0.1, delay_seconds=0.0)


class PullAttacker(threading.Thread):
    """A pull node at the attacker's address that answers every unit it leases with
    `answer(work)`, until stopped (at most MAX_LEASES leases)."""

    MAX_LEASES = 600

    def __init__(self, port: int, answer: Callable[[ttypes.WorkRequest], ttypes.TrainResult]
                 ) -> None:
        super().__init__(daemon=True)
        self.port, self.answer = port, answer
        self.stopped = threading.Event()
        self.answered = 0

    def run(self) -> None:
        with AttackerClient(Coordinator, self.port) as client:
            registered = client.register_node(ttypes.RegisterRequest(
                protocol_version=PROTOCOL_VERSION, node_id="evil", pull=True))
            name, secret = registered.node, registered.secret
            for _ in range(self.MAX_LEASES):
                if self.stopped.is_set():
                    return
                lease = client.lease_unit(ttypes.LeaseRequest(
                    protocol_version=PROTOCOL_VERSION, node=name, wait_seconds=1.0,
                    secret=secret))
                if lease.work is None:
                    continue
                work = lease.work
                client.submit_result(ttypes.SubmitRequest(
                    protocol_version=PROTOCOL_VERSION, node=name, secret=secret,
                    run_id=work.run_id, unit_id=work.unit_id, attempt=work.attempt,
                    result=self.answer(work)))
                self.answered += 1


@pytest.mark.parametrize("codec", ["none", "topk"])
def test_a_result_claiming_more_than_the_model_is_refused_before_it_is_decoded(
        cluster: Cluster, codec: str) -> None:
    """With compression off, topk is a codec the run did not ask for; with topk on, the
    bomb names the model's tensors but claims shapes far larger than theirs."""
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, nodes=cluster.nodes)
    attacker = PullAttacker(coordinator.port, bombed_result)
    attacker.start()
    coordinator.wait_for(r"node pull:evil registered")
    before = peak_bytes(coordinator)
    try:
        result = cluster.train_json(*RUN, "--set", f"compression.up={codec}", timeout=300.0)
    finally:
        attacker.stopped.set()
        attacker.join(30.0)
    assert attacker.answered > 0, cluster.logs()
    grown = peak_bytes(coordinator) - before
    assert grown < PEAK_GROWTH_LIMIT, f"the coordinator's peak grew by {grown / MIB:.0f} MiB"
    evil = next(n for n in result["nodes"] if n["node"] == "pull:evil")
    assert evil["failed"] >= 1 and evil["accepted"] == 0
    said = "not asked for" if codec == "none" else "claims shape"
    coordinator.wait_for(rf"unit \S+ on pull:evil failed: invalid result: .*{said}")


def work_request(run_id: str, weights: dict[str, np.ndarray]) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(
        protocol_version=PROTOCOL_VERSION, run_id=run_id, round=1, unit_id="u1", attempt=1,
        algorithm="delta_avg", model="mlp", dataset="letters", unit_path="train_letters1.txt",
        config_json="{}", weights=dict_to_wire(weights), scheduling_policy=2)


def refusal(port: int, request: ttypes.WorkRequest) -> str:
    """The InvalidRequest message the node answers `request` with, from the attacker."""
    with AttackerClient(ComputeNode, port, timeout=120.0) as client, \
            pytest.raises(ttypes.InvalidRequest) as refused:
        client.train_with_weights(request)
    return refused.value.message


def test_a_node_refuses_weights_in_a_codec_the_run_did_not_ask_for_before_decoding(
        cluster: Cluster) -> None:
    node = cluster.add_node(0.0)
    before = peak_bytes(node)
    message = refusal(node.port, work_request("bomb", topk_bomb("W1")))
    assert "not asked for" in message
    grown = peak_bytes(node) - before
    assert grown < PEAK_GROWTH_LIMIT, f"the node's peak grew by {grown / MIB:.0f} MiB"


def test_weights_that_do_not_fit_the_model_are_not_kept(cluster: Cluster) -> None:
    """Plain weights of another shape, for three runs: each is refused, none is kept."""
    node = cluster.add_node(0.0)
    wrong = {"W1": np.ones((64 * MIB // 8,), dtype=np.float64)}  # 64 MiB
    refusal(node.port, work_request("warm-up", {"W1": np.ones(3)}))  # imports not counted
    before = resident_bytes(node)
    for run in ("wrong-1", "wrong-2", "wrong-3"):
        assert refusal(node.port, work_request(run, wrong))

    def grown() -> int:
        return resident_bytes(node) - before

    assert wait_until(lambda: grown() < 32 * MIB, 15.0), \
        f"the node holds {grown() / MIB:.0f} MiB more after three refused requests"
