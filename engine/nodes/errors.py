"""How a call to a compute node can fail, in the coordinator's own terms.

Every node client (engine.nodes.client) raises only these, whatever carries its
calls; the Thrift client maps the wire's errors (wire.errors) to them in one place
(engine.nodes.thrift_client). The engine decides retries, benching and discarding on the
class alone.
"""

from __future__ import annotations


class NodeError(Exception):
    """A call to a compute node failed; the message says how."""


class NodeUnavailable(NodeError):
    """The call never reached the node (no connection could be opened): the node's
    failure, not the unit's."""


class NodeTimedOut(NodeError):
    """The node took the call and did not answer in time."""


class NodeRefused(NodeError):
    """The node answered that it will not run this call (an invalid request)."""


class NodeUnfit(NodeRefused):
    """The node cannot serve this run (it lacks a plug-in the run names, builds another
    model or holds another copy of the data set): leave it out of the run."""


class NodeIncompatible(NodeRefused):
    """The node speaks another protocol version: no call to it can succeed."""


class AnswerTooLarge(NodeError):
    """This process refused the node's answer as bigger than it takes (--max-message-mb):
    the limit is this process's, so the node is not benched for it."""


class NodeRemoteError(NodeError):
    """The call failed on the way or on the node (a reset, a remote exception)."""


class InvalidResult(NodeError):
    """The node answered with a result that cannot be decoded (malformed tensors)."""


class AttemptAborted(NodeError):
    """A call given up from outside: its unit passed its deadline or its node went dead."""
