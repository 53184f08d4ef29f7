"""ComputeNode calls carried as bytes, for pull nodes that take no connections.

The coordinator cannot dial a pull node, so a session call for it (MD-GAN's
discriminator moves) travels inside the node's lease: the request struct encoded with
Thrift's binary protocol, the answer coming back the same way through `submit_call`.
Only the calls listed here may travel so; a node runs nothing else it is sent.
"""

from __future__ import annotations

from typing import Any

from thrift.protocol.TBinaryProtocol import TBinaryProtocolFactory
from thrift.TSerialization import deserialize, serialize

from thrift_trainer.wire.generated import ttypes

# method -> (request type, result type)
RELAYED_CALLS: dict[str, tuple[type, type]] = {
    "export_session": (ttypes.SessionRequest, ttypes.SessionState),
    "import_session": (ttypes.ImportSessionRequest, ttypes.SessionAck),
    "drop_sessions": (ttypes.DropSessionsRequest, ttypes.SessionAck),
}
_PROTOCOL = TBinaryProtocolFactory()


class UnknownCall(ValueError):
    """A method that may not travel inside a lease."""


def _types(method: str) -> tuple[type, type]:
    try:
        return RELAYED_CALLS[method]
    except KeyError:
        known = ", ".join(sorted(RELAYED_CALLS))
        raise UnknownCall(f"call {method!r} cannot be relayed to a pull node; "
                          f"only {known}") from None


def encode(struct: Any) -> bytes:
    return serialize(struct, _PROTOCOL)


def decode_request(method: str, data: bytes) -> Any:
    return deserialize(_types(method)[0](), data, _PROTOCOL)


def decode_result(method: str, data: bytes) -> Any:
    return deserialize(_types(method)[1](), data, _PROTOCOL)
