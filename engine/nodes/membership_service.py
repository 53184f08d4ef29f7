"""The membership calls of the Coordinator service: registration, heartbeats, pull mode.

A coordinator serves them to its nodes; a relay serves them to its own members on its
members port (compute_node/relay_members.py), so pull nodes can sit under a relay too.
Both answer from a `Membership` (``self.membership``).
"""

from __future__ import annotations

from thrift_trainer.engine.nodes.membership import MemberError, Membership
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.version import check_protocol_version


class MembershipService:
    """register_node, heartbeat, lease_unit, submit_result, submit_call and leave."""

    membership: Membership
    service_name = "coordinator"  # named in a protocol-version mismatch

    def register_node(self, request: ttypes.RegisterRequest) -> ttypes.RegisterResult:
        check_protocol_version(request.protocol_version, self.service_name)
        try:
            return self.membership.register(request)
        except MemberError as exc:
            raise ttypes.InvalidRequest(message=str(exc)) from None

    def heartbeat(self, request: ttypes.HeartbeatRequest) -> ttypes.HeartbeatResult:
        check_protocol_version(request.protocol_version, self.service_name)
        return self.membership.heartbeat(request)

    def lease_unit(self, request: ttypes.LeaseRequest) -> ttypes.LeaseResult:
        check_protocol_version(request.protocol_version, self.service_name)
        return self.membership.lease(request)

    def submit_result(self, request: ttypes.SubmitRequest) -> ttypes.SubmitResult:
        check_protocol_version(request.protocol_version, self.service_name)
        return self.membership.submit(request)

    def submit_call(self, request: ttypes.CallResult) -> ttypes.SubmitResult:
        check_protocol_version(request.protocol_version, self.service_name)
        return self.membership.submit_call(request)

    def leave(self, request: ttypes.LeaveRequest) -> ttypes.LeaveResult:
        check_protocol_version(request.protocol_version, self.service_name)
        return self.membership.leave(request)
