"""The ledger's statements, written once for both databases.

SQLite's driver takes `?` for a parameter, psycopg's `%s`; each store builds its
LedgerSql once with its own placeholder (and SQLite's index hints, which PostgreSQL's
planner does without), so no statement is rewritten while the store runs. Everything
else in these statements is SQL that SQLite and PostgreSQL both take as it is.
"""

from __future__ import annotations

from thrift_trainer.coordinator.store_records import UNSETTLED

# The columns of a RunRecord, and of a NodeRecord (the names are the record's fields).
_RUN_COLUMNS = ("id, created, state, algorithm, model, dataset, rounds, config, policy, "
                "message, ended, (SELECT COUNT(*) FROM rounds WHERE run_id = runs.id)")
NODE_RECORD_COLUMNS = ("node", "accepted", "rejected", "delayed", "failed", "cancelled",
                       "samples", "last_answer", "last_failure", "last_reason", "last_heartbeat")


def marks(mark: str, n: int) -> str:
    """``n`` placeholders, comma-separated."""
    return ", ".join([mark] * n)


class LedgerSql:
    """Every statement of the ledger with the placeholder ``p`` of one driver;
    ``index_hints``: name the status indexes the status queries read (SQLite's planner
    otherwise scans every unit of a long run); ``kept_counts``: a run's units per status
    are read from the table its triggers keep (SQLite's run_store.py), else counted."""

    def __init__(self, p: str, index_hints: bool, kept_counts: bool) -> None:
        self.p = p
        units_hint = " INDEXED BY units_by_status" if index_hints else ""
        attempts_hint = " INDEXED BY attempts_by_status" if index_hints else ""
        unit = f"run_id = {p} AND round = {p} AND unit_id = {p}"
        unsettled = marks(p, len(UNSETTLED))
        self.unit_where = unit
        self.event_insert = (
            "INSERT INTO unit_events (run_id, round, unit_id, attempt, node, from_status, "
            f"to_status, attempt_status, reason, time) VALUES ({marks(p, 10)})")

        # runs
        self.create_run = (
            "INSERT INTO runs (id, created, state, algorithm, model, dataset, rounds, config, "
            f"policy) VALUES ({p}, {p}, 'running', {marks(p, 6)})")
        self.running_runs = (f"SELECT id FROM runs WHERE state = 'running' ORDER BY created "
                             f"LIMIT {p}")
        self.run_state = f"SELECT state FROM runs WHERE id = {p}"
        self.set_rounds = f"UPDATE runs SET rounds = {p} WHERE id = {p}"
        self.run_again = (f"UPDATE runs SET state = 'running', message = NULL, ended = NULL "
                          f"WHERE id = {p}")
        self.end_run = f"UPDATE runs SET state = {p}, message = {p}, ended = {p} WHERE id = {p}"
        self.get_run = f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = {p}"
        self.list_runs = (f"SELECT {_RUN_COLUMNS} FROM runs "
                          f"ORDER BY created DESC, rowid DESC LIMIT {p}")

        # rounds
        self.record_round = (
            "INSERT INTO rounds (run_id, round, validation_error, validation_loss, train_loss, "
            f"seconds, completed_units, discarded_units, ended) VALUES ({marks(p, 9)})")
        self.round_recorded = f"SELECT 1 FROM rounds WHERE run_id = {p} AND round = {p}"
        self.forget_rounds_after = f"DELETE FROM rounds WHERE run_id = {p} AND round > {p}"
        self.list_rounds = (
            "SELECT round, validation_error, validation_loss, train_loss, seconds, "
            "completed_units, discarded_units, ended FROM rounds "
            f"WHERE run_id = {p} ORDER BY round")

        # privacy charges (coordinator/ledger_charges.py): never forgotten by a resume
        self.charge_insert = (
            "INSERT INTO privacy_charges (run_id, charge, round, epsilon, time) "
            f"SELECT {p}, COALESCE(MAX(charge), 0) + 1, {p}, {p}, {p} "
            f"FROM privacy_charges WHERE run_id = {p}")
        self.round_charged = (f"SELECT 1 FROM privacy_charges WHERE run_id = {p} "
                              f"AND round = {p}")
        self.charge_count = f"SELECT COUNT(*) FROM privacy_charges WHERE run_id = {p}"
        self.list_charges = (f"SELECT charge, round, epsilon, time FROM privacy_charges "
                             f"WHERE run_id = {p} ORDER BY charge")

        # units
        self.unit_status = f"SELECT status FROM units WHERE {unit}"
        self.round_units = f"SELECT unit_id, status FROM units WHERE run_id = {p} AND round = {p}"
        self.plan_unit = (
            "INSERT INTO units (run_id, round, unit_id, status, created, updated, pass) "
            f"VALUES ({p}, {p}, {p}, 'pending', {p}, {p}, {p})")
        self.units_after = (f"SELECT round, unit_id, status FROM units WHERE run_id = {p} "
                            f"AND round > {p}")
        self.reopen_unit = (f"UPDATE units SET status = 'pending', failures = 0, "
                            f"last_reason = {p}, updated = {p} WHERE {unit}")
        self.unsettled_after = (
            f"SELECT round, unit_id, status FROM units WHERE run_id = {p} AND round > {p} "
            f"AND round != {p} AND status IN ({unsettled})")
        self.copy_unit_into = (
            "INSERT INTO units (run_id, round, unit_id, status, node, attempts, failures, "
            f"last_reason, created, updated, pass) SELECT run_id, {p}, unit_id, status, node, "
            f"attempts, failures, last_reason, created, updated, pass FROM units WHERE {unit}")
        self.move_attempts = f"UPDATE attempts SET round = {p} WHERE {unit}"
        self.move_events = f"UPDATE unit_events SET round = {p} WHERE {unit}"
        self.delete_unit = f"DELETE FROM units WHERE {unit}"
        self.attempts_so_far = (f"SELECT unit_id, attempts FROM units WHERE run_id = {p} AND "
                                f"round = {p} AND attempts > 0")
        self.unit_in_progress = (f"UPDATE units SET status = 'in_progress', node = {p}, "
                                 f"attempts = attempts + 1, updated = {p} WHERE {unit}")
        self.unit_after_attempt = (
            f"UPDATE units SET status = {p}, failures = failures + {p}, "
            f"node = COALESCE({p}, node), last_reason = COALESCE({p}, last_reason), "
            f"updated = {p} WHERE {unit}")
        self.move_unit = (f"UPDATE units SET status = {p}, failures = failures + {p}, "
                          f"last_reason = COALESCE({p}, last_reason), updated = {p} "
                          f"WHERE {unit}")
        self.unsettled_of = (
            f"SELECT round, unit_id, status FROM units WHERE run_id = {p} "
            f"AND (CAST({p} AS INTEGER) IS NULL OR round = {p}) AND status IN ({unsettled})")
        self.cancel_unit = (f"UPDATE units SET status = 'cancelled', last_reason = {p}, "
                            f"updated = {p} WHERE {unit}")

        # attempts
        self.start_attempt = (
            "INSERT INTO attempts (run_id, round, unit_id, attempt, node, status, started) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, 'in_progress', {p})")
        # one query for every answer: the unit's status, the attempt's owner and status,
        # how many other attempts of the unit are live, the run's state
        self.live_attempt = (
            "SELECT u.status, a.node, a.status, (SELECT COUNT(*) FROM attempts o WHERE "
            "o.run_id = u.run_id AND o.round = u.round AND o.unit_id = u.unit_id AND "
            f"o.status = 'in_progress' AND o.attempt != {p}), (SELECT state FROM runs r "
            "WHERE r.id = u.run_id) FROM units u LEFT JOIN attempts a ON "
            "a.run_id = u.run_id AND a.round = u.round AND a.unit_id = u.unit_id AND "
            f"a.attempt = {p} WHERE u.run_id = {p} AND u.round = {p} AND u.unit_id = {p}")
        self.end_attempt = (f"UPDATE attempts SET status = {p}, ended = {p}, reason = {p} "
                            f"WHERE {unit} AND attempt = {p}")
        self.completed_attempts_after = (
            f"SELECT round, unit_id, attempt FROM attempts WHERE run_id = {p} AND round > {p} "
            "AND status = 'completed'")
        self.stale_attempt = (f"UPDATE attempts SET status = 'stale', reason = {p} WHERE "
                              f"{unit} AND attempt = {p}")
        self.live_attempts_of_run = (
            f"SELECT a.round, a.unit_id, a.attempt, a.node, u.status FROM attempts a"
            f"{attempts_hint} JOIN units u ON u.run_id = a.run_id AND u.round = a.round AND "
            f"u.unit_id = a.unit_id WHERE a.run_id = {p} AND a.status = 'in_progress'")
        self.cancel_attempt = (f"UPDATE attempts SET status = 'cancelled', ended = {p}, "
                               f"reason = {p} WHERE {unit} AND attempt = {p}")

        # nodes
        self.node_upsert = f"""INSERT INTO nodes (run_id, node, accepted, rejected, delayed,
                failed, cancelled, samples, last_answer, last_failure, last_reason)
            VALUES ({marks(p, 11)})
            ON CONFLICT (run_id, node) DO UPDATE SET
                accepted = nodes.accepted + excluded.accepted,
                rejected = nodes.rejected + excluded.rejected,
                delayed = nodes.delayed + excluded.delayed,
                failed = nodes.failed + excluded.failed,
                cancelled = nodes.cancelled + excluded.cancelled,
                samples = nodes.samples + excluded.samples,
                last_answer = COALESCE(excluded.last_answer, nodes.last_answer),
                last_failure = COALESCE(excluded.last_failure, nodes.last_failure),
                last_reason = COALESCE(excluded.last_reason, nodes.last_reason)"""
        self.node_heartbeat = (
            f"INSERT INTO nodes (run_id, node, last_heartbeat) VALUES ({p}, {p}, {p}) "
            "ON CONFLICT (run_id, node) DO UPDATE SET last_heartbeat = excluded.last_heartbeat")
        self.node_stats = (f"SELECT {', '.join(NODE_RECORD_COLUMNS)} FROM nodes "
                           f"WHERE run_id = {p} ORDER BY node")

        # status queries
        self.unsettled_units = (
            "SELECT round, unit_id, status, node, updated, attempts, failures, last_reason "
            f"FROM units{units_hint} WHERE run_id = {p} AND status IN ({unsettled})")
        self.latest_discard = (
            f"SELECT unit_id, node, last_reason FROM units{units_hint} WHERE run_id = {p} "
            "AND status = 'discarded' ORDER BY updated DESC, round DESC LIMIT 1")
        self.live_attempts = (
            f"SELECT round, unit_id, node, started FROM attempts{attempts_hint} "
            f"WHERE run_id = {p} AND status = 'in_progress' ORDER BY attempt")
        self.unit_history = (
            "SELECT round, unit_id, attempt, node, from_status, to_status, attempt_status, "
            f"reason, time FROM unit_events WHERE {unit} ORDER BY id")
        self.run_counts = (f"SELECT status, n FROM unit_counts WHERE run_id = {p}"
                           if kept_counts else
                           f"SELECT status, COUNT(*) FROM units WHERE run_id = {p} "
                           "GROUP BY status")
        self.round_counts = (f"SELECT status, COUNT(*) FROM units WHERE run_id = {p} "
                             f"AND round = {p} GROUP BY status")
        self.pass_counts = (f"SELECT pass, status, COUNT(*) FROM units WHERE run_id = {p} "
                            "AND pass IS NOT NULL GROUP BY pass, status")
        self.schema_version = "SELECT version FROM schema_version LIMIT 2"
        self.set_schema_version = f"UPDATE schema_version SET version = {p}"
        self.insert_schema_version = f"INSERT INTO schema_version (version) VALUES ({p})"


SQLITE = LedgerSql("?", index_hints=True, kept_counts=True)
# PostgreSQL counts: a counter row a trigger updates for every unit makes each update of
# a write-behind batch (one transaction) walk that row's versions so far, slower and slower
POSTGRES = LedgerSql("%s", index_hints=False, kept_counts=False)
