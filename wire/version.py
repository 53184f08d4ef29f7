"""The protocol-version handshake every service performs on its first call."""

from thrift_trainer.wire.generated import PROTOCOL_VERSION, ttypes

# What a coordinator's ping answers as its node_id: a client checks that it reached one.
COORDINATOR_ID = "coordinator"
# NodeInfo.role of a coordinator that stands by (one of several sharing a PostgreSQL store)
STANDBY_ROLE = "coordinator standby"
# how a relay's members port names itself in its pings (NodeInfo.role)
MEMBERS_PORT = "the members port of relay"


def check_protocol_version(version: int, who: str) -> None:
    """Raise the declared VersionMismatch when a peer speaks another protocol version."""
    if version != PROTOCOL_VERSION:
        raise ttypes.VersionMismatch(
            message=f"protocol version {version} does not match the {who}'s {PROTOCOL_VERSION}; "
            "run the same release of the trainer on the client, coordinator and nodes",
            expected=PROTOCOL_VERSION,
            received=version,
        )
