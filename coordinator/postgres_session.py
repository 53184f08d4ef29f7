"""A psycopg connection as the PostgreSQL run store uses it (the Database protocol of
coordinator/store_protocol.py): statements in psycopg's own placeholders
(coordinator/ledger_sql.py's POSTGRES), with server-side parameters, so the statements a
run repeats are prepared once per connection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import pq

from thrift_trainer.coordinator.postgres_location import without_passwords


class PostgresSession:
    """One connection of the store's pool, and whether its last statement was a COMMIT
    (a connection lost then leaves the transaction's outcome unknown)."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection
        self.committing = False  # the last statement sent was a COMMIT

    @property
    def in_transaction(self) -> bool:
        status = self.connection.info.transaction_status
        return status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)

    def execute(self, sql: str, parameters: Any = None) -> psycopg.Cursor:
        self.committing = sql == "COMMIT"
        return self.connection.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any]) -> None:
        rows = list(parameters)
        if rows:
            with self.connection.cursor() as cursor:
                cursor.executemany(sql, rows)

    def close(self) -> None:
        self.connection.close()

    @property
    def lost(self) -> bool:
        return self.connection.closed or self.connection.broken


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect_problem(url: str, seconds: float) -> str | None:
    """Why no connection can be made, in the server's words; None when one can."""
    try:
        psycopg.connect(url, connect_timeout=max(1, round(seconds))).close()
    except psycopg.Error as exc:
        return without_passwords(first_line(exc), url)
    return None
