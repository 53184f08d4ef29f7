"""A node's own link to the coordinator: self-registration, heartbeats, pull mode.

`CoordinatorLink` registers a push node (it gives the port it listens on, and the
coordinator's runs pick it up at their next round), heartbeats, and says goodbye on
stop. `PullWorker` is the pull mode of a node that cannot accept connections: it
registers, then leases one unit at a time, computes it with the same handler as a
push node (load simulation included) and submits the result; heartbeats give up
leases the coordinator cancels. An unreachable coordinator is retried with growing
back-off, for `retry_for` seconds at most, so a dead one cannot keep a node waiting.
Given several coordinators (a leader and its standbys), a node works for the one that
leads: an unreachable one sends it to the next, and a standby's answer to its
registration names the leader.
Every call after registering carries the registration's secret, without which the
coordinator answers as for a node it does not know.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from thrift.Thrift import TException

from thrift_trainer.compute_node.call_errors import CallError, PeerRefused, mapped_errors
from thrift_trainer.compute_node.handler import ComputeNodeHandler
from thrift_trainer.wire import node_calls, security
from thrift_trainer.wire.generated import PROTOCOL_VERSION, Coordinator, ttypes
from thrift_trainer.wire.rpc import connect

log = logging.getLogger("compute_node.pull")

LEASE_WAIT_SECONDS = 2.0
RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS = 0.5, 10.0


class PullStopped(Exception):
    """The node cannot go on (coordinator gone too long, refused); the message says why."""


@dataclass
class PullSettings:
    host: str
    port: int
    node_id: str
    load_prob: float
    device: str = "cpu"
    retry_for: float = 300.0
    connect_timeout: float = 5.0
    listen_host: str | None = None  # a push node registering itself: where it listens
    listen_port: int | None = None
    more: tuple[tuple[str, int], ...] = ()  # further coordinators: a leader's standbys
    clients: str | None = None  # a pull node's --clients: the client indices it holds


class CoordinatorLink:
    """Registration, heartbeats and leaving; alone, it announces a push node."""

    def __init__(self, handler: ComputeNodeHandler, settings: PullSettings) -> None:
        self.handler = handler
        self.settings = settings
        self.stopped = threading.Event()
        self.name = ""
        self.secret: str | None = None  # the registration's: every later call carries it
        self._heartbeat_seconds = 1.0
        self._addresses = [(settings.host, settings.port), *settings.more]
        self._at = 0  # the coordinator called now

    @property
    def coordinator(self) -> str:
        host, port = self._addresses[self._at]
        return f"{host}:{port}"

    def start(self) -> None:
        """Register, then heartbeat in a thread until `stop()`."""
        self._register()
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self._leave()

    def _register(self) -> None:
        s = self.settings
        pull = s.listen_port is None
        began = time.monotonic()
        while True:
            result = self._call("register_node", lambda: ttypes.RegisterRequest(
                protocol_version=PROTOCOL_VERSION, node_id=s.node_id, pull=pull,
                host=s.listen_host, port=s.listen_port, load_prob=s.load_prob,
                device=s.device, clients=s.clients))
            if result.leader is None:
                break
            standby = self.coordinator
            self._follow(result.leader)
            log.info("coordinator %s stands by; registering with %s", standby, self.coordinator)
            if time.monotonic() - began > s.retry_for:
                raise PullStopped(f"no coordinator led within {s.retry_for:.0f}s "
                                  f"({standby} stands by)")
            if self.stopped.wait(RETRY_FIRST_SECONDS):
                raise PullStopped("stopped")
        self.name, self._heartbeat_seconds = result.node, result.heartbeat_seconds
        self.secret = result.secret
        log.info("registered with %s as %s", self.coordinator, self.name)

    def _follow(self, leader: str) -> None:
        """Call the leader a standby named next (added to the list if new), or, when it
        named none, the next coordinator of the list."""
        host, _, port = leader.rpartition(":")
        if host and port.isdigit():
            if (host, int(port)) not in self._addresses:
                self._addresses.append((host, int(port)))
            self._at = self._addresses.index((host, int(port)))
        else:
            self._at = (self._at + 1) % len(self._addresses)

    def _heartbeats(self) -> None:
        while not self.stopped.wait(self._heartbeat_seconds):
            try:
                answer = self._call("heartbeat", lambda: ttypes.HeartbeatRequest(
                    protocol_version=PROTOCOL_VERSION, node=self.name, secret=self.secret,
                    units_running=self.handler.counters.running,
                    delaying=self.handler.delaying(),
                    progress=self.handler.progress()), retry=False)
            except (PullStopped, CallError) as exc:
                log.debug("heartbeat failed: %s", exc)
                continue
            if not answer.known and self.settings.listen_port is not None:
                self._register_again()  # a push node the coordinator forgot (a new leader)
                continue
            for key in answer.cancel or []:
                run_id, unit_id, attempt = key.rsplit("/", 2)
                self.handler.cancel_unit(ttypes.CancelUnitRequest(
                    run_id=run_id, unit_id=unit_id, attempt=int(attempt)))

    def _register_again(self) -> None:
        try:
            self._register()
        except PullStopped as exc:
            log.warning("could not register again: %s", exc)

    def _leave(self) -> None:
        if not self.name:
            return
        try:
            self._call("leave", lambda: ttypes.LeaveRequest(
                protocol_version=PROTOCOL_VERSION, node=self.name, secret=self.secret),
                retry=False)
        except (PullStopped, CallError) as exc:
            log.debug("could not say goodbye: %s", exc)

    # ------------------------------------------------------------------- calls
    def _call(self, method: str, build, read_timeout: float = 30.0, retry: bool = True):
        """One call on a fresh connection, retried with back-off while the coordinator
        is unreachable; declared refusals (version, token) stop the node at once. Without
        `retry`, a failure raises CallError."""
        s = self.settings
        began, wait = time.monotonic(), RETRY_FIRST_SECONDS
        while True:
            host, port = self._addresses[self._at]
            try:
                with (mapped_errors(),
                      connect(Coordinator.Client, host, port, connect_timeout=s.connect_timeout,
                              read_timeout=read_timeout) as client):
                    return getattr(client, method)(build())
            except PeerRefused as exc:
                raise PullStopped(f"the coordinator refused this node: {exc}") from None
            except CallError as exc:
                if not retry:
                    raise
                if self.stopped.is_set():
                    raise PullStopped("stopped") from None
                failing = time.monotonic() - began
                if failing > s.retry_for:
                    raise PullStopped(f"coordinator {host}:{port} unreachable for "
                                      f"{failing:.0f}s: {exc}") from None
                if len(self._addresses) > 1:  # the next one may lead now
                    self._at = (self._at + 1) % len(self._addresses)
                    wait = RETRY_FIRST_SECONDS
                log.warning("coordinator %s:%d unreachable (%s); trying %s in %.1fs",
                            host, port, exc, self.coordinator, wait)
                if self.stopped.wait(wait):
                    raise PullStopped("stopped") from None
                wait = min(RETRY_MAX_SECONDS, wait * 2)


class PullWorker(CoordinatorLink):
    """Registers with the coordinator, then leases, computes and submits until stopped."""

    def run(self) -> None:
        """Work until `stopped` is set; raises PullStopped when the node must give up."""
        self.start()
        try:
            while not self.stopped.is_set():
                lease = self._call("lease_unit", lambda: ttypes.LeaseRequest(
                    protocol_version=PROTOCOL_VERSION, node=self.name, secret=self.secret,
                    wait_seconds=LEASE_WAIT_SECONDS,
                    max_message_bytes=security.current().messages.max_message_bytes),
                    LEASE_WAIT_SECONDS + 10.0)
                if not lease.known:
                    self._register()
                elif lease.work is not None:
                    self._work(lease.work)
                elif lease.call is not None:
                    self._run_call(lease.call)
        finally:
            self._leave()

    def _work(self, work: ttypes.WorkRequest) -> None:
        error, result = None, None
        try:
            result = self.handler.train_with_weights(work)
        except (ttypes.InvalidRequest, ttypes.VersionMismatch) as exc:
            error = exc.message
            result = ttypes.TrainResult(accepted=False, outcome=ttypes.UnitOutcome.CANCELLED,
                                        update=[], num_samples=0, loss=0.0, error=0.0,
                                        compute_seconds=0.0, delay_seconds=0.0, message=error)
        answer = self._call("submit_result", lambda: ttypes.SubmitRequest(
            protocol_version=PROTOCOL_VERSION, node=self.name, secret=self.secret,
            run_id=work.run_id, unit_id=work.unit_id, attempt=work.attempt, result=result,
            error=error))
        if not answer.accepted:
            log.info("result of unit %s not taken: %s", work.unit_id, answer.message)

    def _run_call(self, call: ttypes.NodeCall) -> None:
        """A session call relayed through the lease (this node takes no connections)."""
        result, error = None, None
        try:
            request = node_calls.decode_request(call.method, call.request)
            result = node_calls.encode(getattr(self.handler, call.method)(request))
        except node_calls.UnknownCall as exc:
            error = str(exc)
        except (ttypes.InvalidRequest, ttypes.VersionMismatch) as exc:
            error = exc.message
        except TException as exc:  # an undecodable request
            error = f"cannot decode the {call.method} request: {exc}"
        self._call("submit_call", lambda: ttypes.CallResult(
            protocol_version=PROTOCOL_VERSION, node=self.name, secret=self.secret,
            call_id=call.call_id, result=result, error=error))
