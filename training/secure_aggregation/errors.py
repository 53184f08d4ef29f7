"""The one error of secure aggregation."""

from __future__ import annotations


class SecAggError(ValueError):
    """A secure-aggregation step refused or failed: a phase called out of order or twice, a
    ciphertext that does not open, too few shares to rebuild a secret, a set of clients
    that contradicts an earlier one. The message names the client concerned."""
