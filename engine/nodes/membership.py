"""Nodes that announce themselves: registration, heartbeats, leaving, and pull mode.

A node may register instead of (or besides) being listed in compute_nodes.txt. A push
node gives the host and port it listens on; runs pick it up at their next round like a
line added to the nodes file. A pull node (behind NAT, in a notebook) accepts no
connections: it leases units from its mailbox here with `lease_unit` and hands results
back with `submit_result`; `pull_node.PullNodeHandle` makes such a node look to the engine
like any other, so pushed and pulling nodes mix in one run.

Each registration gets a secret of its own, which the node's later calls (heartbeat, lease,
submit, leave) must carry: a call for a node without its secret is answered as for a node
not registered, so another node, even one with the shared token, can neither settle its
leases nor speak or leave for it. A registration under a name that a live node holds (heard
within the suspect time) waits up to that time for it to fall silent (a node that restarted
and registers again), then is refused: it would close the live node's mailbox.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from thrift_trainer.engine import runtime
from thrift_trainer.engine.nodes.errors import NodeUnavailable
from thrift_trainer.engine.nodes.liveness import (
    DEAD_SECONDS,
    HEARTBEAT_SECONDS,
    SUSPECT_SECONDS,
    Liveness,
)
from thrift_trainer.engine.nodes.nodes_file import NodeAddress
from thrift_trainer.training.clients.held import HeldClients
from thrift_trainer.wire.chunks import limit_text, size_text
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.stats import encoded_size

log = logging.getLogger("coordinator.members")

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
MAX_MEMBERS = 1024
MAX_LEASE_WAIT_SECONDS = 10.0  # a lease call waits at most this long for work
REGISTER_POLL_SECONDS = 0.25  # how often a registration checks whether a holder fell silent
UnitKey = tuple[str, str, int]  # run_id, unit_id, attempt; (CALL, call_id, 0) for calls
CALL = "\0call"  # no run id can start with a NUL


class MemberError(ValueError):
    """A registration that cannot be accepted; the message says why."""


@dataclass
class Pending:
    """A unit (or a relayed call) waiting in a pull node's mailbox, then leased, until
    its answer is in."""

    request: ttypes.WorkRequest | None = None
    call: ttypes.NodeCall | None = None
    done: runtime.EventLike = field(default_factory=runtime.Event)
    result: Any = None  # a TrainResult, or a call's encoded answer
    error: str | None = None  # the node could not run it (InvalidRequest)
    failure: str | None = None  # given up once leased: lease expired, node left or dead
    # given up before the node leased it (it left, or never asked): not the unit's failure
    unreached: str | None = None
    unfit: str | None = None  # the node cannot take it (too big for it): leave it out


class Mailbox:
    """A pull node's units: queued for a lease, then leased until submitted."""

    def __init__(self) -> None:
        self._cond = runtime.Condition()
        self._queue: deque[Pending] = deque()
        self._leased: dict[UnitKey, Pending] = {}
        self._cancel: list[UnitKey] = []
        self.closed = False

    def put(self, request: ttypes.WorkRequest | None = None,
            call: ttypes.NodeCall | None = None) -> Pending:
        pending = Pending(request, call)
        with self._cond:
            if self.closed:
                raise NodeUnavailable("the pull node left")
            self._queue.append(pending)
            self._cond.notify_all()
        return pending

    def lease(self, wait_seconds: float, max_bytes: int | None = None) -> Pending | None:
        """The next unit or call, leased; a unit whose request is over `max_bytes` (the
        largest message the node takes) is not leased but ends as unfit for the node."""
        deadline = runtime.monotonic() + _lease_wait(wait_seconds)
        with self._cond:
            while not self._queue and not self.closed:
                remaining = deadline - runtime.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self.closed:
                return None
            pending = self._queue.popleft()
            too_big = _too_big(pending, max_bytes)
            if too_big is None:
                self._leased[key_of(pending)] = pending
                return pending
        pending.unfit = too_big
        pending.done.set()
        return None

    def submit(self, key: UnitKey, result: Any, error: str | None) -> bool:
        with self._cond:
            pending = self._leased.pop(key, None)
        if pending is None:
            return False
        pending.result, pending.error = result, error
        pending.done.set()
        return True

    def withdraw(self, pending: Pending, reason: str | None) -> None:
        """Give a unit up: out of the queue, or off its lease (the node is told to stop).
        With a reason it is a failure; without, the unit ends with the result it has."""
        key = key_of(pending)
        with self._cond:
            queued = pending in self._queue
            if queued:
                self._queue.remove(pending)
            elif self._leased.pop(key, None) is not None and pending.request is not None:
                self._cancel.append(key)
        if queued and reason:
            pending.unreached = pending.unreached or reason
        else:
            pending.failure = pending.failure or reason
        pending.done.set()

    def cancels(self) -> list[str]:
        with self._cond:
            keys, self._cancel = self._cancel, []
        return [f"{r}/{u}/{a}" for r, u, a in keys]

    def close(self, reason: str) -> None:
        with self._cond:
            self.closed = True
            queued, leased = list(self._queue), list(self._leased.values())
            self._queue.clear()
            self._leased.clear()
            self._cond.notify_all()
        for pending in queued:
            pending.unreached = reason
            pending.done.set()
        for pending in leased:
            pending.failure = reason
            pending.done.set()


def _lease_wait(asked: float) -> float:
    """How long a lease call waits for work: as asked, within the coordinator's bound."""
    return max(0.0, min(asked, MAX_LEASE_WAIT_SECONDS))


def _too_big(pending: Pending, max_bytes: int | None) -> str | None:
    """Why a node that takes messages of at most `max_bytes` cannot take this unit."""
    if max_bytes is None or pending.request is None:
        return None
    size = encoded_size(pending.request)
    if size <= max_bytes:
        return None
    return (f"takes messages of at most {limit_text(max_bytes)} MiB (--max-message-mb "
            f"{limit_text(max_bytes)} there) and a unit of this run is {size_text(size)}: "
            "restart it with a larger --max-message-mb")


def key_of(pending: Pending) -> UnitKey:
    if pending.call is not None:
        return CALL, pending.call.call_id, 0
    request = pending.request
    return request.run_id, request.unit_id, request.attempt


@dataclass
class Member:
    name: str
    node_id: str
    pull: bool
    address: NodeAddress | None  # where a push node listens
    liveness: Liveness
    mailbox: Mailbox | None
    secret: str = field(default_factory=lambda: runtime.token_hex(16))
    # When its lease call in progress ends at the latest: that call's end counts as hearing
    # from the node, even one that died during it.
    polling_until: float = 0.0
    held: HeldClients | None = None  # a pull node's clients, announced (None: every one)

    def holds(self, secret: str | None) -> bool:
        """Whether a call carrying ``secret`` comes from this registration."""
        return secret is not None and hmac.compare_digest(secret.encode(), self.secret.encode())


class Membership:
    """Every registered node of this coordinator, shared by its runs."""

    def __init__(self, heartbeat_seconds: float = HEARTBEAT_SECONDS,
                 suspect_seconds: float = SUSPECT_SECONDS,
                 dead_seconds: float = DEAD_SECONDS) -> None:
        self.heartbeat_seconds = heartbeat_seconds
        self.suspect_seconds, self.dead_seconds = suspect_seconds, dead_seconds
        self._lock = runtime.Lock()
        self._members: dict[str, Member] = {}

    def register(self, request: ttypes.RegisterRequest) -> ttypes.RegisterResult:
        member = self._member_of(request)
        self._wait_until_free(member.name)
        with self._lock:
            old = self._members.get(member.name)
            if old is not None and old.liveness.state() == "alive":  # it spoke meanwhile
                raise MemberError(self._held(old))
            if old is None and len(self._members) >= MAX_MEMBERS:
                raise MemberError(f"this coordinator already has {MAX_MEMBERS} registered nodes")
            if old is not None and old.mailbox is not None:
                old.mailbox.close("the node registered again (it restarted)")
            self._members[member.name] = member
        log.info("node %s registered (%s)", member.name, "pull" if member.pull else "push")
        return ttypes.RegisterResult(node=member.name, heartbeat_seconds=self.heartbeat_seconds,
                                     suspect_seconds=self.suspect_seconds,
                                     dead_seconds=self.dead_seconds, secret=member.secret)

    def _wait_until_free(self, name: str) -> None:
        """Wait, up to the suspect time, until no live node holds ``name``; MemberError
        if one still does (two nodes with one id, or another node posing as it)."""
        now, old = runtime.monotonic(), self.get(name)
        # A node that died in a lease call is heard once more as the call ends: a restart
        # that registers sooner waits that call out too (at most MAX_LEASE_WAIT_SECONDS).
        polling = max(0.0, old.polling_until - now) if old is not None else 0.0
        if polling:
            polling += REGISTER_POLL_SECONDS  # the call ends a moment after its wait
        deadline = now + self.suspect_seconds + polling
        while True:
            old = self.get(name)
            if old is None or old.liveness.state() != "alive":
                return
            left = deadline - runtime.monotonic()
            if left <= 0:
                raise MemberError(self._held(old))
            runtime.sleep(min(left, REGISTER_POLL_SECONDS))  # silence comes with time alone

    def _held(self, old: Member) -> str:
        return (f"node {old.name} is registered by a node still alive (heard "
                f"{old.liveness.silent_seconds():.1f}s ago); give this node another "
                f"--node-id, or stop the other one")

    def _member_of(self, request: ttypes.RegisterRequest) -> Member:
        if not NODE_ID.match(request.node_id or ""):
            raise MemberError(f"node id {request.node_id!r} must be 1-128 letters, digits or "
                              "._:@- characters")
        liveness = Liveness(self.suspect_seconds, self.dead_seconds)
        if request.pull:
            return Member(f"pull:{request.node_id}", request.node_id, True, None, liveness,
                          Mailbox(), held=_held_of(request.clients))
        if not request.host or not request.port or not 0 < request.port < 65536:
            raise MemberError("a push node registers the host and port it listens on")
        address = NodeAddress(request.host, request.port)
        return Member(str(address), request.node_id, False, address, liveness, None)

    def heartbeat(self, request: ttypes.HeartbeatRequest) -> ttypes.HeartbeatResult:
        member = self._caller(request.node, request.secret)
        if member is None:
            return ttypes.HeartbeatResult(known=False)
        member.liveness.heard(request.delaying, request.progress)
        cancel = member.mailbox.cancels() if member.mailbox else []
        return ttypes.HeartbeatResult(known=True, cancel=cancel or None)

    def lease(self, request: ttypes.LeaseRequest) -> ttypes.LeaseResult:
        member = self._caller(request.node, request.secret)
        if member is None or member.mailbox is None:
            return ttypes.LeaseResult(known=False)
        member.liveness.heard()
        member.polling_until = runtime.monotonic() + _lease_wait(request.wait_seconds)
        pending = member.mailbox.lease(request.wait_seconds, request.max_message_bytes)
        member.liveness.heard()
        if pending is None:
            return ttypes.LeaseResult(known=True)
        return ttypes.LeaseResult(known=True, work=pending.request, call=pending.call)

    def submit(self, request: ttypes.SubmitRequest) -> ttypes.SubmitResult:
        member = self._caller(request.node, request.secret)
        if member is None or member.mailbox is None:
            return ttypes.SubmitResult(accepted=False, message="unknown node: register again")
        member.liveness.heard()
        key = (request.run_id, request.unit_id, request.attempt)
        if member.mailbox.submit(key, request.result, request.error):
            return ttypes.SubmitResult(accepted=True)
        return ttypes.SubmitResult(accepted=False,
                                   message="no such lease: it expired or the unit was settled")

    def submit_call(self, request: ttypes.CallResult) -> ttypes.SubmitResult:
        member = self._caller(request.node, request.secret)
        if member is None or member.mailbox is None:
            return ttypes.SubmitResult(accepted=False, message="unknown node: register again")
        member.liveness.heard()
        if member.mailbox.submit((CALL, request.call_id, 0), request.result, request.error):
            return ttypes.SubmitResult(accepted=True)
        return ttypes.SubmitResult(accepted=False, message="no such call: it was given up")

    def leave(self, request: ttypes.LeaveRequest) -> ttypes.LeaveResult:
        with self._lock:
            member = self._members.get(request.node)
            if member is None or not member.holds(request.secret):
                return ttypes.LeaveResult(known=False)
            del self._members[request.node]
        if member.mailbox is not None:
            member.mailbox.close("the node left")
        log.info("node %s left", member.name)
        return ttypes.LeaveResult(known=True)

    def forget_all(self, reason: str) -> None:
        """Drop every registration (this coordinator no longer leads): each node's next
        call finds itself unknown and registers again, where the leader is."""
        with self._lock:
            members, self._members = list(self._members.values()), {}
        for member in members:
            if member.mailbox is not None:
                member.mailbox.close(reason)

    def get(self, name: str) -> Member | None:
        with self._lock:
            return self._members.get(name)

    def _caller(self, name: str, secret: str | None) -> Member | None:
        """The registration ``name`` when the call carries its secret; else None, as for a
        node not registered (logged: another node acting for it, or one registered anew)."""
        member = self.get(name)
        if member is not None and not member.holds(secret):
            log.warning("refused a call for node %s without its registration's secret",
                        name[:128])
            return None
        return member

    def members(self) -> list[Member]:
        with self._lock:
            return list(self._members.values())

    def push_addresses(self) -> list[NodeAddress]:
        return [m.address for m in self.members() if m.address is not None]


def _held_of(text: str | None) -> HeldClients | None:
    """The clients a pull node announced (MemberError for a malformed list)."""
    if text is None:
        return None
    try:
        return HeldClients.parse(text)
    except ValueError as exc:
        raise MemberError(f"clients: {exc}") from None
