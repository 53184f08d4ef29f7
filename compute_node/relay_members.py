"""A relay's members port: the Coordinator service's membership calls, for its group.

`compute_node.py <port> <load> --relay FILE --members-port P` listens on P as well, where
nodes join the relay's group as they would join a coordinator: pull nodes
(`compute_node.py --pull RELAY_HOST:P ...`) lease their units there, and push nodes may
announce themselves (`--register RELAY_HOST:P`). The run calls of the service (train,
status, cancel) belong to the coordinator and are refused here with a message that says
so. Token and TLS settings apply to this port as to the relay's own.
"""

from __future__ import annotations

from collections.abc import Callable

from thrift_trainer.engine.nodes.membership import Membership
from thrift_trainer.engine.nodes.membership_service import MembershipService
from thrift_trainer.wire.generated import ttypes
from thrift_trainer.wire.version import MEMBERS_PORT, check_protocol_version


class RelayMembersHandler(MembershipService):
    """Implements Coordinator.Iface for a relay's members: membership calls only."""

    service_name = "relay"

    def __init__(self, relay_id: str, membership: Membership,
                 ping: Callable[[ttypes.PingRequest], ttypes.NodeInfo]) -> None:
        self.relay_id = relay_id
        self.membership = membership
        self._ping = ping

    def ping(self, request: ttypes.PingRequest) -> ttypes.NodeInfo:
        """The relay's own answer, saying which port this is (a client pointed here by
        mistake names it)."""
        info = self._ping(request)
        info.role = f"{MEMBERS_PORT} {self.relay_id}"
        return info

    def train(self, request: ttypes.TrainRequest) -> ttypes.RunResult:
        check_protocol_version(request.protocol_version, self.service_name)
        raise ttypes.InvalidRequest(message=self._not_here("runs"))

    def status(self, request: ttypes.StatusRequest) -> ttypes.RunStatus:
        raise ttypes.UnknownRun(message=self._not_here("runs"))

    def cancel(self, request: ttypes.CancelRunRequest) -> ttypes.CancelRunResult:
        raise ttypes.UnknownRun(message=self._not_here("runs"))

    def list_runs(self, request: ttypes.ListRunsRequest) -> ttypes.ListRunsResult:
        return ttypes.ListRunsResult(runs=[])

    def _not_here(self, what: str) -> str:
        return (f"this is the members port of relay {self.relay_id}: it takes nodes "
                f"joining its group, not {what}; send runs to the coordinator")
