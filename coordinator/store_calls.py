"""How the stores' calls are marked: one the engine makes while it trains, or a query.
A store decides what a mark means (coordinator/sql_ledger.py's `_call` and
`_before_read`): the SQLite store makes every call at once, the PostgreSQL store's
wrapper (coordinator/store_outage.py) may make a write later, or again."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def rides_out_outages(method: Callable[..., Any]) -> Callable[..., Any]:
    """A call the engine makes while it trains: a store on a database server (PostgreSQL)
    may make it later, in a batch, and makes it again, whole, while the database is away
    (see coordinator/store_outage.py); the SQLite store just makes it."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._call(method, *args, **kwargs)
    return call


def reads_what_was_written(method: Callable[..., Any]) -> Callable[..., Any]:
    """A query: a store that makes writes later (PostgreSQL's) makes them first."""
    @functools.wraps(method)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._before_read()
        return method(self, *args, **kwargs)
    return read
