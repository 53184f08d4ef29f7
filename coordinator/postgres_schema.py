"""The PostgreSQL run store's schema: its tables, its version and its migrations.

The ledger's tables are the SQLite store's (coordinator/run_store.py) in PostgreSQL's
types, written out rather than derived from them: each database's schema has its own
version and migrations, and a change to one must not silently change the other's. What
PostgreSQL adds: the run files, the leader and its lease (coordinator/leadership.py) and,
since version 2, the kept results (coordinator/kept_results.py). Version 3 adds the
privacy charges, which the SQLite store has too (its version 4).
"""

from __future__ import annotations

import logging

from thrift_trainer.coordinator.ledger_sql import POSTGRES
from thrift_trainer.coordinator.schema_steps import SchemaSteps
from thrift_trainer.coordinator.store_protocol import Database
from thrift_trainer.coordinator.store_records import SchemaError

log = logging.getLogger("coordinator.store")
SCHEMA_VERSION = 3  # 2: kept_results, 3: privacy_charges
SCHEMA_LOCK = 0x7472_6169  # advisory lock id: two coordinators creating the schema at once

_SCHEMA = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    # rowid: the order of insertion, as SQLite's rowid (runs created in the same second)
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        rowid BIGINT GENERATED ALWAYS AS IDENTITY,
        created DOUBLE PRECISION NOT NULL,
        state TEXT NOT NULL
            CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
        algorithm TEXT NOT NULL,
        model TEXT NOT NULL,
        dataset TEXT NOT NULL,
        rounds INTEGER NOT NULL,
        config TEXT NOT NULL,
        policy INTEGER,
        message TEXT,
        ended DOUBLE PRECISION)""",
    "CREATE INDEX runs_by_created ON runs (created)",
    """CREATE TABLE rounds (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        round INTEGER NOT NULL,
        validation_error DOUBLE PRECISION,
        validation_loss DOUBLE PRECISION,
        train_loss DOUBLE PRECISION,
        seconds DOUBLE PRECISION,
        completed_units INTEGER NOT NULL,
        discarded_units INTEGER NOT NULL,
        ended DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, round))""",
    """CREATE TABLE units (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'in_progress', 'completed',
            'failed', 'stale', 'cancelled', 'discarded')),
        node TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        last_reason TEXT,
        created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        pass INTEGER,
        PRIMARY KEY (run_id, round, unit_id))""",
    "CREATE INDEX units_by_status ON units (run_id, status)",
    """CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        node TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed',
            'stale', 'pending', 'discarded', 'cancelled')),
        started DOUBLE PRECISION NOT NULL,
        ended DOUBLE PRECISION,
        reason TEXT,
        PRIMARY KEY (run_id, round, unit_id, attempt),
        FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
    "CREATE INDEX attempts_by_status ON attempts (run_id, status)",
    """CREATE TABLE unit_events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT NOT NULL,
        round INTEGER NOT NULL,
        unit_id TEXT NOT NULL,
        attempt INTEGER,
        node TEXT,
        from_status TEXT,
        to_status TEXT NOT NULL,
        attempt_status TEXT,
        reason TEXT,
        time DOUBLE PRECISION NOT NULL,
        FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
    "CREATE INDEX unit_events_by_unit ON unit_events (run_id, round, unit_id, id)",
    """CREATE TABLE nodes (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        node TEXT NOT NULL,
        accepted INTEGER NOT NULL DEFAULT 0,
        rejected INTEGER NOT NULL DEFAULT 0,
        delayed INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        cancelled INTEGER NOT NULL DEFAULT 0,
        samples BIGINT NOT NULL DEFAULT 0,
        last_answer DOUBLE PRECISION,
        last_failure DOUBLE PRECISION,
        last_reason TEXT,
        last_heartbeat DOUBLE PRECISION,
        PRIMARY KEY (run_id, node))""",
    """CREATE TABLE run_files (
        run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        part INTEGER NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (run_id, name, part))""",
    # The leader and its fencing epoch; the lease's expiry in a row of its own, so that
    # renewing it never waits for the leader's writes, which share-lock the leader row.
    """CREATE TABLE leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch BIGINT NOT NULL,
        holder TEXT,
        address TEXT)""",
    "INSERT INTO leader (id, epoch) VALUES (1, 0)",
    """CREATE TABLE lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        expires TIMESTAMPTZ)""",
    "INSERT INTO lease (id) VALUES (1)",
)
# What each version adds to the one before; a database of an older version is brought
# up to date under the schema lock, a fresh one gets _SCHEMA and then every step.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: units' results, kept until a checkpoint covers them (coordinator/kept_results.py)
    2: ("""CREATE TABLE kept_results (
            run_id TEXT NOT NULL,
            round INTEGER NOT NULL,
            unit_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            epoch BIGINT,
            node TEXT NOT NULL,
            num_samples BIGINT NOT NULL,
            loss DOUBLE PRECISION,
            names TEXT NOT NULL,
            sequence INTEGER,
            staleness INTEGER,
            PRIMARY KEY (run_id, round, unit_id),
            FOREIGN KEY (run_id, round, unit_id) REFERENCES units ON DELETE CASCADE)""",
        """CREATE TABLE kept_result_parts (
            run_id TEXT NOT NULL,
            round INTEGER NOT NULL,
            unit_id TEXT NOT NULL,
            part INTEGER NOT NULL,
            data BYTEA NOT NULL,
            PRIMARY KEY (run_id, round, unit_id, part),
            FOREIGN KEY (run_id, round, unit_id) REFERENCES kept_results ON DELETE CASCADE)""",
        # tensors hardly compress: not trying saves the server the time
        "ALTER TABLE kept_result_parts ALTER COLUMN data SET STORAGE EXTERNAL"),
    # 3: the releases a private run's budget is charged (coordinator/ledger_charges.py)
    3: ("""CREATE TABLE privacy_charges (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            charge INTEGER NOT NULL CHECK (charge >= 1),
            round INTEGER NOT NULL,
            epsilon DOUBLE PRECISION,
            time DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (run_id, charge))""",),
}
_STEPS = SchemaSteps(SCHEMA_VERSION, _MIGRATIONS, POSTGRES.set_schema_version, "database")


def check_schema(db: Database, path: str) -> None:
    """Create the schema in an empty database, or bring an older one up to date, under
    the schema lock, in the caller's transaction; SchemaError for a database that holds
    something else or a newer version."""
    db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
    if db.execute("SELECT to_regclass('schema_version')").fetchone()[0] is not None:
        _check_version(db, path)
        return
    tables = db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = "
                        "current_schema()").fetchone()[0]
    if tables:
        raise SchemaError(f"{path} holds {tables} tables but no run store (no "
                          "schema_version table): use another database")
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute(POSTGRES.insert_schema_version, (1,))
    _STEPS.migrate(db, 1)


def _check_version(db: Database, path: str) -> None:
    older = _STEPS.bring_up_to_date(db, path, db.execute(POSTGRES.schema_version).fetchall())
    if older is not None:
        log.info("run store %s: schema version %d brought up to %d", path, older,
                 SCHEMA_VERSION)
