"""A run store's schema version, checked and brought up to date a step at a time: the rule
both backends follow, each with its own statements and steps (the SQLite file's in
coordinator/run_store.py, the PostgreSQL database's in coordinator/postgres_schema.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from thrift_trainer.coordinator.store_protocol import Database
from thrift_trainer.coordinator.store_records import SchemaError


@dataclass(frozen=True)
class SchemaSteps:
    """One backend's schema history: ``steps[v]`` brings version v - 1 to v."""

    current: int
    steps: Mapping[int, Sequence[str]]
    set_version: str  # the statement that records the version reached
    other: str  # what to use instead of a newer store, in messages ("file", "database")

    def bring_up_to_date(self, db: Database, path: str, rows: list) -> int | None:
        """Check the version read in ``rows`` and migrate an older schema in the caller's
        transaction; the version it was migrated from, or None when it was current.
        SchemaError for a newer or unknown version."""
        version = rows[0][0] if len(rows) == 1 else None
        if version == self.current:
            return None
        if isinstance(version, int) and 1 <= version < self.current:
            self.migrate(db, version)
            return version
        if isinstance(version, int) and version > self.current:
            raise SchemaError(f"{path} has run store schema version {version}, newer than "
                              f"this coordinator understands ({self.current}): use a newer "
                              f"coordinator or another {self.other}")
        raise SchemaError(f"{path} has an unknown run store schema version "
                          f"{[r[0] for r in rows]!r} (expected {self.current})")

    def migrate(self, db: Database, version: int) -> None:
        """Bring a schema of ``version`` up to the current one, a step at a time."""
        for step in range(version + 1, self.current + 1):
            for statement in self.steps[step]:
                db.execute(statement)
        db.execute(self.set_version, (self.current,))
