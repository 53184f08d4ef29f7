"""The one error of the clients' building blocks."""

from __future__ import annotations


class ClientsError(ValueError):
    """Settings no partitioner, sampler or generator can meet (more clients than
    examples, a concentration that is not positive, ...); the message is one line that
    names the setting."""
