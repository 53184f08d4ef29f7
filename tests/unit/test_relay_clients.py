"""A relay's announcement of its members' node-resident clients, and the coordinator's
watch on relays whose live members changed (no processes: handles over a fake client)."""

from __future__ import annotations

import json
import logging

import pytest

from thrift_trainer.compute_node.relay_clients import MemberClients, announced
from thrift_trainer.engine.nodes.liveness import Liveness
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.engine.nodes.pool import NodeHandle
from thrift_trainer.engine.nodes.relay_groups import RelayGroups
from thrift_trainer.engine.records import NodeSummary
from thrift_trainer.training.units import UnitSpec
from thrift_trainer.wire.generated import ttypes


class _Client:
    accepts_connections = True

    def __init__(self, port: int) -> None:
        self.address = NodeAddress("127.0.0.1", port)


def _member(port: int, clients: dict[str, tuple[int, str]], alive: bool = True) -> NodeHandle:
    """A checked member holding ``clients`` (name -> examples, data fingerprint)."""
    handle = NodeHandle(port, f"127.0.0.1:{port}", _Client(port))
    handle.clients_checked = True
    handle.clients = frozenset(clients)
    handle.client_sizes = {name: size for name, (size, _) in clients.items()}
    handle.client_labels = {name: {0: size} for name, (size, _) in clients.items()}
    handle.client_fingerprints = {name: fp for name, (_, fp) in clients.items()}
    if not alive:
        handle.liveness = Liveness(suspect=0.0, dead=0.0)  # silent long enough: dead
    return handle


def test_the_union_of_the_live_members_clients_is_announced() -> None:
    a = _member(1, {"ward-1": (10, "f1"), "ward-2": (20, "f2")})
    b = _member(2, {"clinic": (30, "f3")})
    dead = _member(3, {"lab": (40, "f4")}, alive=False)
    clients = MemberClients().gather("run", [a, b, dead])
    assert clients.sizes == {"ward-1": 10, "ward-2": 20, "clinic": 30}
    answer = announced(ttypes.RunCheck(ok=True), clients, "model-fp")
    assert answer.clients == ["clinic", "ward-1", "ward-2"]
    assert answer.model_fingerprint == "model-fp"
    assert answer.client_sizes == {"clinic": 30, "ward-1": 10, "ward-2": 20}
    assert answer.client_fingerprints == {"ward-1": "f1", "ward-2": "f2", "clinic": "f3"}
    assert json.loads(answer.client_labels["clinic"]) == {"0": 30}


def test_a_member_holding_a_name_with_other_data_is_left_out_with_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    a = _member(1, {"ward-2": (20, "f2")})
    c = _member(3, {"ward-2": (25, "other"), "ward-9": (5, "f9")})
    relay = MemberClients()
    with caplog.at_level(logging.WARNING, logger="compute_node.relay"):
        for _ in range(3):  # checked again and again, as members come and go
            c.clients = frozenset({"ward-2", "ward-9"})  # its own check says so each time
            clients = relay.gather("run", [a, c])
    assert clients.sizes == {"ward-2": 20} and clients.fingerprints() == {"ward-2": "f2"}
    assert c.clients == frozenset()  # the relay sends it none of the run's client units
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["member 127.0.0.1:3 is left out of run run: client 'ward-2' is announced "
                     "by nodes 127.0.0.1:1 and 127.0.0.1:3 with different data (20 and 25 "
                     "examples): node-resident client names must be unique across nodes (one "
                     "name on two nodes is one client's data, held twice)"], lines


def test_a_relay_holding_no_client_now_says_so_without_a_model_fingerprint() -> None:
    dead = _member(1, {"ward-1": (10, "f1")}, alive=False)
    answer = announced(ttypes.RunCheck(ok=True), MemberClients().gather("run", [dead]), "fp")
    assert answer.clients == [] and answer.model_fingerprint is None
    assert answer.client_sizes is None


def _relay(name: str, members: dict[str, str]) -> NodeHandle:
    handle = NodeHandle(0, name, _Client(9))
    handle.clients_checked = True
    handle.members = [NodeSummary(node=node, state=state, silent_seconds=0.0, pull=False)
                      for node, state in members.items()]
    return handle


def test_a_relay_is_asked_again_when_its_live_members_change() -> None:
    relay = _relay("relay", {"a": "alive", "b": "alive"})
    plain = NodeHandle(1, "node", _Client(8))  # no group: never asked again for it
    groups = RelayGroups()
    groups.checked([relay, plain])
    assert groups.changed([relay, plain]) == []
    relay.members[1] = NodeSummary(node="b", state="suspect", silent_seconds=4.0, pull=False)
    assert groups.changed([relay, plain]) == [relay]
    groups.checked([relay])
    assert groups.changed([relay]) == []
    relay.members[1] = NodeSummary(node="b", state="alive", silent_seconds=0.0, pull=False)
    assert groups.changed([relay]) == [relay]  # back: asked again, its clients with it


def test_a_clients_unit_passed_down_whole_draws_as_on_its_own_holder() -> None:
    assert UnitSpec("ward-1~r0~r0", "", client="ward-1").seed_id == "ward-1"
    assert UnitSpec("client7.d12~r0", "", client="client7").seed_id == "client7.d12"
    assert UnitSpec("u3~r1", "").seed_id == "u3~r1"  # a slice of a shared unit: its own
