"""Payloads bigger than a frame through every path, in real processes on 127.0.0.1: pushed
and pull nodes, relays (both levels), local workers and MD-GAN's tensors travel in chunks;
a node killed or a connection cut mid-transfer fails that attempt only; broken chunk
sequences are dropped by the node and the coordinator; refused payloads say why.

Every process runs with ``--max-frame-mb 1`` while the model's weights and updates are
4.4 MB: they can only have travelled as sequences of chunks, each a frame within the limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from devtools import local_cluster as procs
from tests.hostile import BROKEN_SEQUENCES, answer_to_announcement, chunked_call, hangs_up_within
from tests.integration.test_relays import relay_over
from tests.integration.test_wire_rpc import work
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

WIDE_MLP = textwrap.dedent('''
    from torch import nn


    def make_net(in_features, num_classes, width=1024):
        return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(),
                             nn.Linear(width, width), nn.ReLU(), nn.Linear(width, num_classes))
    ''')
MODEL_BYTES = 4 * (16 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 26 + 26)  # 4.4 MB
FRAMES = ("--max-frame-mb", "1")
WIRE = (*FRAMES, "--plugins", "wide_mlp")  # every node, relay and coordinator
RUN = ["--set", "run.model=wide_mlp:make_net", "--set", "run.dataset=letters",
       "--set", "data.format=letters", "--set", "data.normalize=true",
       "--set", "run.algorithm=sync_sgd", "--set", "sync_sgd.images_per_work_unit=128",
       "--set", "sync_sgd.units_per_iteration=2",
       "--set", "sync_sgd.num_workunits_per_update=2", "--set", "sync_sgd.lr=0.05",
       "--set", "run.rounds=3", *FRAMES]
HOST = "127.0.0.1"
WAIT = 30.0


@pytest.fixture
def wide(cluster):
    (cluster.workdir / "wide_mlp.py").write_text(WIDE_MLP, encoding="utf-8")
    return cluster


def trained(cluster, *extra: str, rounds: int = 3) -> dict:
    result = cluster.train_json(*RUN, "--set", f"run.rounds={rounds}", *extra, timeout=300)
    assert result["rounds"] == rounds, result
    units = 2 * rounds  # two units a round, weights each
    assert result["bytes_down"] >= units * MODEL_BYTES
    assert result["bytes_up"] >= units * MODEL_BYTES
    assert np.isfinite([h["validation_error"] for h in result["history"]]).all()
    return result


def pull_node(cluster, name: str, port: int, *flags: str) -> procs.Proc:
    node = procs.start_pull_node(cluster.workdir, name, port, 0.0, *flags)
    cluster.nodes.append(node)  # stopped with the cluster
    return node


# ------------------------------------------------------------ every path
def test_pushed_nodes_one_with_local_workers_train_a_model_bigger_than_any_frame(wide):
    plain = wide.add_node(0.0, *WIRE)
    workers = wide.add_node(0.0, *WIRE, "--workers", "2")
    wide.start_coordinator(2, *WIRE)
    result = trained(wide)
    nodes = {n["node"]: n for n in result["nodes"]}
    for node in (plain, workers):  # units went both ways through each, none failed
        assert nodes[f"{HOST}:{node.port}"]["accepted"] >= 2
        assert nodes[f"{HOST}:{node.port}"]["failed"] == 0
    saved = load_file(str(Path(result["coordinator_run_dir"]) / "model.safetensors"))
    assert saved["2.weight"].shape == (1024, 1024)
    # the final weights came back to the client in chunks too: it saved them
    assert (wide.workdir / result["model_path"]).stat().st_size > MODEL_BYTES


def test_pull_nodes_lease_and_submit_a_model_bigger_than_any_frame(wide):
    """Two pull nodes; one that takes smaller messages is left out when it leases."""
    wide.start_coordinator(2, *WIRE, nodes=[])
    for name in ("pull1", "pull2"):
        pull_node(wide, name, wide.coordinator.port, *WIRE)
    pull_node(wide, "small", wide.coordinator.port, *WIRE, "--max-message-mb", "2")
    for name in ("pull1", "pull2", "small"):
        wide.coordinator.wait_for(rf"node pull:{name} registered")
    result = trained(wide)
    nodes = {n["node"]: n for n in result["nodes"]}
    assert nodes["pull:pull1"]["accepted"] and nodes["pull:pull2"]["accepted"], nodes
    assert nodes["pull:small"]["accepted"] == 0
    assert nodes["pull:small"]["note"].startswith(
        "takes messages of at most 2 MiB (--max-message-mb 2 there) and a unit of this run "
        "is 4.2 MiB (")


def test_relays_pass_a_model_bigger_than_any_frame_down_both_levels(wide):
    """Coordinator to relay, relay to a pushed and a pull member, and back up."""
    pushed = wide.add_node(0.0, *WIRE)
    relay = relay_over(wide, "relay", [pushed], *WIRE, "--members-port", "0")
    members_port = int(relay.wait_for(r"members join on port (\d+)").group(1))
    pull_node(wide, "member", members_port, *WIRE)
    relay.wait_for(r"node pull:member registered")
    wide.start_coordinator(2, *WIRE, nodes=[relay])
    result = trained(wide)
    (top,) = result["nodes"]
    counts = {m["node"]: m["accepted"] for m in top["members"]}
    assert counts["pull:member"] > 0 and counts[f"{HOST}:{pushed.port}"] > 0, top


def test_md_gan_moves_images_feedback_and_discriminators_in_chunks(cluster, monkeypatch):
    """MD-GAN's per-unit tensors and its discriminator swaps, relayed through the
    coordinator for a pull node, in chunks of 64 KiB; the coordinator's wire counts show
    that every such message was split."""
    chunk = 64 * 1024
    stats = cluster.workdir / "wire-{pid}.json"
    monkeypatch.setenv("TRAINER_WIRE_STATS", str(stats))
    small_chunks = ("--chunk-mb", "0.0625")
    cluster.add_node(0.0, *small_chunks)
    cluster.start_coordinator(2, *small_chunks, "--deadline-floor", "120")
    pull_node(cluster, "pull1", cluster.coordinator.port, *small_chunks)
    cluster.coordinator.wait_for(r"node pull:pull1 registered")
    result = cluster.train_json(
        "--config", str(procs.REPO / "configs" / "md_gan_mnist.yaml"),
        "--set", "md_gan.workers=2", "--set", "md_gan.swap_every_epochs=0.05",
        "--set", "run.rounds=8", "--set", "outputs.sample_every=0",
        "--set", "outputs.checkpoint_every=0", *small_chunks, timeout=300)
    assert result["rounds"] == 8
    cluster.coordinator.stop()  # writes its final wire counts
    counts = json.loads(Path(str(stats).replace("{pid}", str(
        cluster.coordinator.popen.pid))).read_text())["by_method"]
    for label, direction in (("train_with_weights call", "sent"),  # images down
                             ("train_with_weights reply", "received"),  # feedback up
                             ("export_session reply", "received"),  # a discriminator
                             ("lease_unit reply", "sent"),  # units and swaps, to the pull node
                             ("submit_result call", "received")):  # feedback from it
        frames, nbytes = counts[label][f"{direction}_frames"], counts[label][f"{direction}_bytes"]
        assert nbytes > 3 * chunk and nbytes / frames <= chunk + 17, (label, counts[label])


# ------------------------------------------------- interrupted transfers
class CuttingProxy:
    """Forwards connections to a node; once, when `direction` ("request" or "reply") of
    one connection has carried `after` bytes, `cut()` is called mid-transfer."""

    def __init__(self, node_port: int, direction: str, after: int,
                 cut: Callable[[list[socket.socket]], None]) -> None:
        self._node_port, self._direction, self._after, self._cut = (
            node_port, direction, after, cut)
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self.fired = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                client, _ = self._listener.accept()
                try:
                    node = socket.create_connection((HOST, self._node_port), timeout=5)
                except OSError:  # the node is dead: the coordinator sees a hang-up
                    client.close()
                    continue
                pair = [client, node]
                for source, target, direction in ((client, node, "request"),
                                                  (node, client, "reply")):
                    threading.Thread(target=self._pump, args=(source, target, direction, pair),
                                     daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, direction: str,
              pair: list[socket.socket]) -> None:
        carried = 0
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
                carried += len(data)
                if (direction == self._direction and carried >= self._after
                        and not self.fired.is_set()):
                    self.fired.set()
                    self._cut(pair)
                    return
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


def _hang_up(pair: list[socket.socket]) -> None:
    for sock in pair:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxies() -> Iterator[list[CuttingProxy]]:
    started: list[CuttingProxy] = []
    yield started
    for proxy in started:
        proxy.close()


def _model(cluster, run_id: str) -> dict[str, np.ndarray]:
    return load_file(str(cluster.workdir / "runs" / run_id / "model.safetensors"))


def test_an_interrupted_transfer_fails_that_attempt_only(wide, proxies):
    """A connection cut while the weights arrive, one cut while the update leaves, and the
    node killed while weights arrive: each time the unit goes to the other node and nothing
    half-received is used, so each deterministic run ends with the very weights of the same
    run on the steady node alone. Two rounds each: the first unit the victim gets is cut."""
    steady = wide.add_node(0.0, *WIRE)
    victim = wide.add_node(0.0, *WIRE)
    nodes_file = wide.workdir / "nodes.txt"
    nodes_file.write_text(f"{HOST},{steady.port}\n")
    wide.coordinator = procs.start_coordinator(wide.workdir, nodes_file, 2, *WIRE,
                                               "--deterministic")
    reference = _model(wide, trained(wide, "--set", "run.seed=3", rounds=2)["run_id"])
    kill = lambda pair: os.kill(victim.popen.pid, signal.SIGKILL)  # noqa: E731
    for direction, cut in (("request", _hang_up), ("reply", _hang_up), ("request", kill)):
        proxy = CuttingProxy(victim.port, direction, after=MODEL_BYTES // 2, cut=cut)
        proxies.append(proxy)
        nodes_file.write_text(f"{HOST},{steady.port}\n{HOST},{proxy.port}\n")
        result = trained(wide, "--set", "run.seed=3", rounds=2)
        assert proxy.fired.is_set(), f"the {direction} was never interrupted"
        through = {n["node"]: n for n in result["nodes"]}[f"{HOST}:{proxy.port}"]
        assert through["failed"] >= 1, through
        interrupted = _model(wide, result["run_id"])
        assert reference.keys() == interrupted.keys()
        for name in reference:
            assert np.array_equal(reference[name], interrupted[name]), (direction, name)
        proxy.close()
        assert victim.alive() == (cut is _hang_up)


# ---------------------------------------------------- broken sequences
def _node_call(chunk: int) -> tuple[bytes, list[bytes]]:
    request = work(w=np.ones(200_000, dtype=np.float32))
    return chunked_call("train_with_weights",
                        ComputeNode.train_with_weights_args(request=request), chunk)


def _coordinator_call(chunk: int) -> tuple[bytes, list[bytes]]:
    result = ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED,
                                update=work(w=np.ones(200_000, dtype=np.float32)).weights,
                                num_samples=1, loss=0.0, error=0.0, compute_seconds=0.0,
                                delay_seconds=0.0)
    request = ttypes.SubmitRequest(protocol_version=PROTOCOL_VERSION, node="pull:x",
                                   run_id="r", unit_id="u", attempt=1, result=result)
    return chunked_call("submit_result", Coordinator.submit_result_args(request=request), chunk)


def test_the_node_and_the_coordinator_drop_broken_chunk_sequences_and_keep_serving(cluster):
    node = cluster.add_node(0.0)
    cluster.start_coordinator(2)
    chunk = 64 * 1024
    for server, service, message in ((node, ComputeNode, _node_call),
                                     (cluster.coordinator, Coordinator, _coordinator_call)):
        for case, broken in BROKEN_SEQUENCES.items():
            announcement, frames = message(chunk)
            with socket.create_connection((HOST, server.port), timeout=WAIT) as sock:
                sock.sendall(announcement)
                assert answer_to_announcement(sock, chunk) is None, case
                sock.sendall(broken(frames))
                if case == "cut mid-chunk":
                    sock.shutdown(socket.SHUT_WR)
                assert hangs_up_within(sock, WAIT), (service.__name__, case)
        with connect(service.Client, HOST, server.port, read_timeout=WAIT) as client:
            assert client.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION))
    assert "accepted" not in node.log()  # no unit of a broken message ever ran
    assert node.alive() and cluster.coordinator.alive()
    for server in (node, cluster.coordinator):
        assert "the message is dropped and the connection closed" in server.log()


# -------------------------------------------------------------- refusals
def test_limits_too_small_for_the_model_say_which_on_which_process(wide):
    """A node that takes smaller messages is left out (the run's status says why), and a
    client that cannot take the final model refuses it, naming its own limit."""
    wide.add_node(0.0, *WIRE)
    small = wide.add_node(0.0, *WIRE, "--max-message-mb", "2")
    wide.start_coordinator(2, *WIRE)
    # one round: the final model is what the client refuses
    done = wide.client(*RUN, "--set", "run.rounds=1", "--max-message-mb", "2", timeout=300)
    assert done.returncode == 1, done.stderr
    assert "this client refused a message of 4.2 MiB" in done.stderr
    assert "(--max-message-mb 2): raise --max-message-mb here" in done.stderr
    assert wide.coordinator.alive()
    status = procs.run_client(["status", HOST, str(wide.coordinator.port), "--json"],
                              wide.workdir)
    note = {n["node"]: n for n in json.loads(status.stdout)["nodes"]}[
        f"{HOST}:{small.port}"]["note"]
    assert note.startswith("refused a message of 4.2 MiB (")
    assert note.endswith("it takes messages of at most 2 MiB (--max-message-mb 2): raise "
                         "--max-message-mb there")


def test_when_no_node_takes_the_model_the_client_says_which_limit(wide):
    wide.add_node(0.0, *WIRE, "--max-message-mb", "2")
    wide.start_coordinator(2, *WIRE)
    done = wide.client(*RUN, timeout=120)
    said = done.stderr + wide.logs()
    assert done.returncode == 1, said
    assert "no node can serve this run: node 127.0.0.1:" in done.stderr, said
    assert "refused a message of 4.2 MiB" in done.stderr, said
    assert "(--max-message-mb 2): raise --max-message-mb there" in done.stderr, said


def test_a_model_over_the_coordinators_message_limit_is_refused_before_the_run(wide):
    wide.add_node(0.0, *WIRE)
    wide.start_coordinator(2, *WIRE, "--max-message-mb", "2")
    done = wide.client(*RUN)
    assert done.returncode == 2, done.stderr
    assert ("a model of 4.2 MiB, whose updates would not fit the 2 MiB this coordinator "
            "takes in one message (--max-message-mb 2)") in done.stderr
