"""Registration, heartbeats and the pull-node mailbox, without sockets."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.errors import AttemptAborted, NodeUnavailable
from thrift_trainer.engine.nodes.membership import Mailbox, MemberError, Membership
from thrift_trainer.engine.nodes.pull_client import PullNodeHandle
from thrift_trainer.engine.tasks import Task
from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes

V = PROTOCOL_VERSION
FAR = 1e9  # a time to read silences at: equal readings mean no word in between


def work(unit: str = "u1", attempt: int = 1) -> ttypes.WorkRequest:
    return ttypes.WorkRequest(protocol_version=V, run_id="r1", round=1, unit_id=unit,
                              attempt=attempt, algorithm="delta_avg", model="mlp",
                              dataset="letters", unit_path=unit, config_json="{}", weights=[],
                              scheduling_policy=2)


def task(unit: str = "u1", attempt: int = 1) -> Task:
    return Task(run_id="r1", round=1, unit_id=unit, attempt=attempt, algorithm="delta_avg",
                model="mlp", dataset="letters", unit_path=unit, config_json="{}", weights={},
                scheduling_policy=2)


def done(message: str = "") -> ttypes.TrainResult:
    return ttypes.TrainResult(accepted=True, outcome=ttypes.UnitOutcome.COMPLETED, update=[],
                              num_samples=5, loss=0.0, error=0.0, compute_seconds=0.0,
                              delay_seconds=0.0, message=message)


def pull_member(membership: Membership, node_id: str = "laptop"):
    name = membership.register(ttypes.RegisterRequest(
        protocol_version=V, node_id=node_id, pull=True)).node
    return name, membership.get(name)


def test_a_lease_waits_a_bounded_time_and_hands_out_units_in_order() -> None:
    box = Mailbox()
    assert box.lease(0.01) is None
    box.put(work("u1"))
    box.put(work("u2"))
    assert box.lease(0.01).request.unit_id == "u1"
    assert box.lease(0.01).request.unit_id == "u2"


def test_a_pull_handle_returns_what_the_node_submits() -> None:
    membership = Membership()
    name, member = pull_member(membership)
    handle = PullNodeHandle(0, member, rpc_timeout=5.0)

    def node() -> None:
        lease = membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name,
                                                     wait_seconds=5.0, secret=member.secret))
        membership.submit(ttypes.SubmitRequest(
            protocol_version=V, node=name, run_id="r1", unit_id=lease.work.unit_id,
            attempt=lease.work.attempt, result=done("from the node"), secret=member.secret))

    threading.Thread(target=node, daemon=True).start()
    assert handle.train(task()).message == "from the node"


def test_an_aborted_lease_fails_the_call_and_the_node_hears_to_stop() -> None:
    membership = Membership()
    name, member = pull_member(membership)
    handle = PullNodeHandle(0, member, rpc_timeout=5.0)
    leased = threading.Event()

    def node() -> None:
        membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name, wait_seconds=5.0,
                                             secret=member.secret))
        leased.set()

    threading.Thread(target=node, daemon=True).start()
    threading.Thread(target=lambda: leased.wait(5) and handle.abort(("r1", "u1", 1), "late"),
                     daemon=True).start()
    with pytest.raises(AttemptAborted, match="late"):
        handle.train(task())
    beat = membership.heartbeat(ttypes.HeartbeatRequest(protocol_version=V, node=name,
                                                        units_running=1, secret=member.secret))
    assert beat.cancel == ["r1/u1/1"]
    assert not membership.submit(ttypes.SubmitRequest(
        protocol_version=V, node=name, run_id="r1", unit_id="u1", attempt=1,
        result=done(), secret=member.secret)).accepted  # too late: the unit went elsewhere


def test_a_unit_the_coordinator_cancels_is_not_a_word_from_the_node() -> None:
    membership = Membership()
    name, member = pull_member(membership)
    handle = PullNodeHandle(0, member, rpc_timeout=5.0)
    last_word: list[float] = []

    def node() -> None:  # leases the unit (a word from it), then the coordinator cancels
        membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name, wait_seconds=5.0,
                                             secret=member.secret))
        last_word.append(member.liveness.silent_seconds(now=FAR))
        handle.cancel("r1", "u1")

    threading.Thread(target=node, daemon=True).start()
    assert handle.train(task()).status.name == "CANCELLED"
    # a dead node's registration must not look alive because its units were cancelled
    assert member.liveness.silent_seconds(now=FAR) == last_word[0]


class ManualClock(runtime.SystemRuntime):
    """A clock that moves only when the code under test sleeps; `at` runs something when
    it passes a time (what another thread would do then)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self._due: list[tuple[float, Callable[[], None]]] = []

    def monotonic(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._due = sorted([*self._due, (when, action)], key=lambda due: due[0])

    def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        while self._due and self._due[0][0] <= until:
            self.now, action = self._due.pop(0)
            action()
        self.now = until


def test_a_node_that_died_in_a_lease_call_can_register_again_at_once() -> None:
    clock = ManualClock()
    with runtime.installed(clock):
        membership = Membership(suspect_seconds=0.2, dead_seconds=1.0)
        name, member = pull_member(membership)
        member.mailbox.put(work())
        membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name, wait_seconds=0.4,
                                             secret=member.secret))  # its call: to 0.4 s
        clock.now = 0.3
        membership.heartbeat(ttypes.HeartbeatRequest(protocol_version=V, node=name,
                                                     units_running=0, secret=member.secret))
        # ... and the node dies: its lease call ends (heard) with no one to answer it
        clock.at(0.4, member.liveness.heard)
        # the restarted process, before that end: the end must not make the old one alive
        again, restarted = pull_member(membership)
    assert again == name and restarted.secret != member.secret
    assert 0.4 < clock.now < 0.2 + 0.4 + 0.25 + 0.25  # waited the call out, and no more


def test_a_pull_nodes_heartbeat_carries_the_progress_of_its_units() -> None:
    membership = Membership()
    name, member = pull_member(membership)
    assert member.liveness.last_progress("r1/u1/1") is None
    membership.heartbeat(ttypes.HeartbeatRequest(protocol_version=V, node=name,
                                                 units_running=1, progress={"r1/u1/1": 12},
                                                 secret=member.secret))
    assert member.liveness.last_progress("r1/u1/1") is not None


def test_leaving_fails_what_the_node_held_and_forgets_it() -> None:
    """The unit it leased fails; those still queued never reached it, which is the
    node's doing, not theirs (they do not count towards discarding them), and so is a
    unit sent after it left."""
    membership = Membership()
    name, member = pull_member(membership)
    held, queued = member.mailbox.put(work("u1")), member.mailbox.put(work("u2"))
    membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name, wait_seconds=1.0,
                                         secret=member.secret))
    assert membership.leave(ttypes.LeaveRequest(protocol_version=V, node=name,
                                                secret=member.secret)).known
    assert held.done.is_set() and held.failure == "the node left" and not held.unreached
    assert queued.done.is_set() and queued.unreached == "the node left"
    assert not queued.failure
    assert not membership.heartbeat(ttypes.HeartbeatRequest(
        protocol_version=V, node=name, units_running=0,
        secret=member.secret)).known  # register again
    with pytest.raises(NodeUnavailable, match="left"):
        member.mailbox.put(work("u3"))
    handle = PullNodeHandle(0, member, rpc_timeout=5.0)
    with pytest.raises(NodeUnavailable, match="left"):
        handle.train(task("u4"))


def test_registrations_are_checked_and_push_nodes_give_an_address() -> None:
    membership = Membership()
    with pytest.raises(MemberError, match="node id"):
        membership.register(ttypes.RegisterRequest(protocol_version=V, node_id="", pull=True))
    with pytest.raises(MemberError, match="host and port"):
        membership.register(ttypes.RegisterRequest(protocol_version=V, node_id="a", pull=False))
    result = membership.register(ttypes.RegisterRequest(
        protocol_version=V, node_id="a", pull=False, host="10.0.0.7", port=9091))
    assert result.node == "10.0.0.7:9091"
    assert [str(a) for a in membership.push_addresses()] == ["10.0.0.7:9091"]


def test_only_the_registration_that_took_a_lease_settles_it() -> None:
    membership = Membership()
    name, member = pull_member(membership)
    pending = member.mailbox.put(work())
    assert membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name,
                                                wait_seconds=1.0, secret=member.secret)).work
    for secret in (None, "0" * 32):  # another node, with the token, acting for this one
        forged = ttypes.SubmitRequest(protocol_version=V, node=name, run_id="r1", unit_id="u1",
                                      attempt=1, result=done("forged"), secret=secret)
        assert not membership.submit(forged).accepted
        assert not membership.lease(ttypes.LeaseRequest(protocol_version=V, node=name,
                                                        wait_seconds=0.0, secret=secret)).known
        assert not membership.heartbeat(ttypes.HeartbeatRequest(
            protocol_version=V, node=name, units_running=0, secret=secret)).known
        assert not membership.leave(ttypes.LeaveRequest(protocol_version=V, node=name,
                                                        secret=secret)).known
    assert not pending.done.is_set()
    assert membership.submit(ttypes.SubmitRequest(
        protocol_version=V, node=name, run_id="r1", unit_id="u1", attempt=1,
        result=done("own"), secret=member.secret)).accepted
    assert pending.result.message == "own"


def test_a_live_nodes_id_cannot_be_registered_again_but_a_silent_ones_can() -> None:
    membership = Membership(suspect_seconds=0.2, dead_seconds=1.0)
    name, member = pull_member(membership)
    pending = member.mailbox.put(work())
    stop = threading.Event()

    def alive() -> None:  # the node heartbeats while another registers under its id
        while not stop.wait(0.05):
            membership.heartbeat(ttypes.HeartbeatRequest(
                protocol_version=V, node=name, units_running=0, secret=member.secret))

    beating = threading.Thread(target=alive, daemon=True)
    beating.start()
    try:
        with pytest.raises(MemberError, match="still alive"):
            pull_member(membership)
        assert not pending.done.is_set()  # its mailbox stays open
    finally:
        stop.set()
        beating.join(5.0)
    again, restarted = pull_member(membership)  # silent now: as a node that restarted
    assert again == name and restarted.secret != member.secret
    assert pending.done.is_set() and "registered again" in pending.unreached


def test_a_pull_node_holds_the_clients_it_announced_and_a_bad_list_is_refused() -> None:
    membership = Membership()
    _, member = pull_member(membership)
    assert PullNodeHandle(0, member, rpc_timeout=5.0).holds("client999")  # every client
    held = membership.get(membership.register(ttypes.RegisterRequest(
        protocol_version=V, node_id="half", pull=True, clients="0-5,9")).node)
    handle = PullNodeHandle(1, held, rpc_timeout=5.0)
    assert [handle.holds(f"client{k}") for k in (0, 5, 6, 9)] == [True, True, False, True]
    assert handle.holds(None) and not handle.holds("client05") and not handle.holds("x1")
    with pytest.raises(MemberError, match="clients: expected an index or a range"):
        membership.register(ttypes.RegisterRequest(protocol_version=V, node_id="bad",
                                                   pull=True, clients="0-5,x"))
