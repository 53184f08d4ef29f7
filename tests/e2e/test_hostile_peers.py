"""Hostile peers at the Thrift ports of real node and coordinator processes: what they
can make a server hold (memory, room for frames) and whether legitimate callers are still
answered while they attack. Attackers connect from 127.0.0.2 (tests/hostile.py)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from devtools.local_cluster import run_client
from tests.conftest import Cluster
from tests.hostile import attacker_socket, frame_header, hangs_up_within, resident_bytes
from tests.waiting import wait_until
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ComputeNode, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

# Their processes' memory is what these tests measure: fresh interpreters, not forks.
pytestmark = pytest.mark.fresh_processes

MIB = 1024 * 1024
HOST = "127.0.0.1"


def node_answers(port: int) -> bool:
    with connect(ComputeNode.Client, HOST, port, read_timeout=10.0) as client:
        return client.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION)) is not None


def test_partial_frames_cut_off_at_the_frame_timeout_leave_no_memory_behind(
        cluster: Cluster) -> None:
    """Each cut-off frame is logged; what the log keeps of repeated lines must not keep
    the frame's buffer."""
    frame_mb, partial_mb = 96, 64
    node = cluster.add_node(0.0, "--frame-timeout", "2", "--max-frame-mb", str(frame_mb))
    assert node_answers(node.port)  # warmed up: its first call's imports are not counted
    before = resident_bytes(node)
    for _ in range(3):  # one after another: each cut off before the next starts
        with attacker_socket(node.port) as sock:
            with contextlib.suppress(OSError):  # cut off while sending: hung up already
                sock.sendall(frame_header(frame_mb * MIB) + bytes(partial_mb * MIB))
            assert hangs_up_within(sock, 15.0), "a partial frame was not cut off"
    node.wait_for(r"no more within the frame timeout")

    def grown() -> int:
        return resident_bytes(node) - before

    assert wait_until(lambda: grown() < 24 * MIB, 15.0), \
        f"the node holds {grown() / MIB:.0f} MiB more after the partial frames were cut off"
    assert node_answers(node.port)


def test_token_less_peers_announcing_big_frames_do_not_starve_callers_with_the_token(
        cluster: Cluster, tmp_path: Path) -> None:
    """Four connections each announce a frame as big as allowed and send one byte of it:
    the room they claim for unfinished frames is capped per address, so a caller with the
    token, from another address, is answered at once while they hold it."""
    token = tmp_path / "token"
    token.write_text("starvation-token")
    coordinator = cluster.start_coordinator(2, "--token-file", str(token), nodes=[])
    attackers = [attacker_socket(coordinator.port) for _ in range(4)]
    try:
        for sock in attackers:
            sock.sendall(frame_header(256 * MIB) + b"x")
        for _ in range(5):
            started = time.monotonic()
            with connect(Coordinator.Client, HOST, coordinator.port, token="starvation-token",
                         read_timeout=10.0) as client:
                assert client.list_runs(ttypes.ListRunsRequest()).runs == []
            assert time.monotonic() - started < 3.0
        done = run_client(["runs", HOST, str(coordinator.port), "--token-file", str(token)],
                          tmp_path, timeout=60.0)
        assert done.returncode == 0, done.stderr
        assert not any(hangs_up_within(sock, 0.01) for sock in attackers)  # still held
    finally:
        for sock in attackers:
            sock.close()


def test_refused_token_less_frames_are_not_kept_while_their_connections_stay_open(
        cluster: Cluster, tmp_path: Path) -> None:
    """A frame without the token is answered Unauthorized; its connection may stay open
    (until the idle timeout), but not its memory: the budget for unfinished frames bounds
    what such peers cost."""
    token = tmp_path / "token"
    token.write_text("kept-token")
    node = cluster.add_node(0.0, "--token-file", str(token))
    with connect(ComputeNode.Client, HOST, node.port, token="kept-token",
                 read_timeout=10.0) as client:  # warmed up: imports are not counted
        client.ping(ttypes.PingRequest(protocol_version=PROTOCOL_VERSION))
    before = resident_bytes(node)
    frame = frame_header(96 * MIB) + bytes(96 * MIB)  # garbage, but whole: it is read
    held = [attacker_socket(node.port) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(frame)
            sock.settimeout(10.0)
            assert sock.recv(1 << 16), "no answer to a frame without the token"

        def grown() -> int:
            return resident_bytes(node) - before

        assert wait_until(lambda: grown() < 48 * MIB, 15.0), \
            f"the node holds {grown() / MIB:.0f} MiB for four refused frames"
        assert not any(hangs_up_within(sock, 0.01) for sock in held)  # still open
    finally:
        for sock in held:
            sock.close()
